package main

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/filter/proxywasm"
)

// sessionSlots bounds the shared-data keys sessions use: Envoy never
// deletes a key, so sessions share 4,096 of them by hash, and a collision
// only costs the older session its pin.
const sessionSlots = 4096

// sessions pins a session (session_header) to the endpoint its last
// request went to, in shared data so that every worker VM sees it: a
// session's history lives in that endpoint's cache even when its prompt
// does not show it (a client that resends only the new turn, a response
// id the engine resolves). The pin counts as the whole prompt cached
// there, so the policy keeps the session there until its load prices it
// out, and the pin follows the session where it goes.
type sessions struct {
	ttl time.Duration
	val [24]byte // session hash, endpoint hash, expiry (unix ms)
	// last is the pin the last lookup read: the request that priced by it
	// pins after routing, and need not read it again.
	last struct {
		session, endpoint uint64
		expires           int64
		ok                bool
	}
}

func sessionKey(session uint64) string {
	return "kvroute/session/" + strconv.FormatUint(session%sessionSlots, 16)
}

// sessionHash names a session header's value; 0 is no session.
func sessionHash(v []byte) uint64 { return xxhash.Sum64(v) | 1 }

// lookup returns the endpoint session is pinned to, if its pin is live.
func (s *sessions) lookup(session uint64) (endpoint uint64, ok bool) {
	l := &s.last
	l.session, l.endpoint, l.expires, l.ok = session, 0, 0, false
	b, _, err := proxywasm.BorrowSharedData(sessionKey(session)) // read at once
	if err != nil || len(b) != len(s.val) || binary.LittleEndian.Uint64(b) != session {
		return 0, false
	}
	l.endpoint, l.expires = binary.LittleEndian.Uint64(b[8:]), int64(binary.LittleEndian.Uint64(b[16:]))
	l.ok = l.expires > time.Now().UnixMilli()
	return l.endpoint, l.ok
}

// pin records that session's request went to endpoint. A live pin to the
// same endpoint with more than half its life left is not rewritten.
func (s *sessions) pin(session, endpoint uint64) {
	now := time.Now()
	if s.last.session != session {
		s.lookup(session)
	}
	if l := &s.last; l.ok && l.endpoint == endpoint && l.expires-now.UnixMilli() > s.ttl.Milliseconds()/2 {
		return
	}
	binary.LittleEndian.PutUint64(s.val[:], session)
	binary.LittleEndian.PutUint64(s.val[8:], endpoint)
	binary.LittleEndian.PutUint64(s.val[16:], uint64(now.Add(s.ttl).UnixMilli()))
	// Last writer wins: two workers pinning one session at once both
	// picked by the same policy, and either pin serves.
	s.last.session = 0 // the pin changed: a later pin reads it afresh
	if err := proxywasm.SetSharedData(sessionKey(session), s.val[:], 0); err != nil {
		proxywasm.LogError("kvroute: pin a session: " + err.Error())
	}
}
