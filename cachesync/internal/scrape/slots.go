package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Slot is one of a llama.cpp server's sequence slots as its /slots shows
// it: the server reuses a slot's prompt only for a request placed in that
// slot, so where each prompt sits is where a request sharing it should go.
type Slot struct {
	ID   int
	Busy bool // processing a request
	// Remaining is how many tokens a busy slot's request may still
	// generate; math.MaxUint32 when it set no limit.
	Remaining int
	// Prompt is the rendered prompt the slot holds, without the BOS token
	// the server's tokenizer adds (and a gateway's text does not have).
	Prompt string
}

// errNoSlotPrompts: the server shows its slots' load but not their
// prompts, which llama-server shows only with LLAMA_SERVER_SLOTS_DEBUG=1 in
// its environment.
var errNoSlotPrompts = errors.New("llama-server shows its slots without their prompts: start it with LLAMA_SERVER_SLOTS_DEBUG=1 for gateways to name the slot holding a request's prefix")

// parseSlots reads a llama-server's /slots; bos is the text of the model's
// BOS token (its /props bos_token), "" for none.
func parseSlots(body []byte, bos string) ([]Slot, error) {
	var rows []struct {
		ID         *int    `json:"id"`
		Task       *int    `json:"id_task"`
		Processing bool    `json:"is_processing"`
		Prompt     *string `json:"prompt"`
		Next       []struct {
			Remain int `json:"n_remain"`
		} `json:"next_token"`
	}
	if err := json.Unmarshal(body, &rows); err != nil {
		return nil, fmt.Errorf("slots: %w", err)
	}
	slots := make([]Slot, 0, len(rows))
	for _, r := range rows {
		if r.ID == nil || *r.ID < 0 {
			return nil, fmt.Errorf("slots: a slot without an id")
		}
		if r.Task != nil && r.Prompt == nil {
			return nil, errNoSlotPrompts
		}
		s := Slot{ID: *r.ID, Busy: r.Processing}
		if r.Prompt != nil {
			s.Prompt = strings.TrimPrefix(*r.Prompt, bos)
		}
		if s.Busy {
			s.Remaining = math.MaxUint32
			if len(r.Next) > 0 && r.Next[0].Remain >= 0 {
				s.Remaining = min(r.Next[0].Remain, math.MaxUint32)
			}
		}
		slots = append(slots, s)
	}
	return slots, nil
}

// fetchSlots reads which prompt each of a llama.cpp server's slots holds.
func (p *poller) fetchSlots(ctx context.Context) ([]Slot, error) {
	body, err := p.get(ctx, "/slots", "application/json")
	if err != nil {
		return nil, err
	}
	return parseSlots(body, p.props.bos)
}
