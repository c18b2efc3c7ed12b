package main

import "strconv"

// slotField is the request field llama.cpp's server reads to put a request
// in one of its slots (and to wait for that slot when it is busy).
const slotField = `"id_slot":`

// withSlot appends to dst the JSON object body with slotField set to slot
// as its last member, which is the one a JSON parser that takes the last
// of duplicate keys (llama.cpp's) keeps; false when body is not an object.
// The body has been parsed as a request already, so only its ends are
// checked.
func withSlot(dst, body []byte, slot int) ([]byte, bool) {
	first, last := 0, len(body)-1
	for first < len(body) && isSpace(body[first]) {
		first++
	}
	for last > first && isSpace(body[last]) {
		last--
	}
	if first >= last || body[first] != '{' || body[last] != '}' {
		return dst, false
	}
	inner := last - 1
	for inner > first && isSpace(body[inner]) {
		inner--
	}
	dst = append(dst, body[:last]...)
	if inner > first { // a member before
		dst = append(dst, ',')
	}
	dst = append(dst, slotField...)
	dst = strconv.AppendInt(dst, int64(slot), 10)
	return append(dst, body[last:]...), true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
