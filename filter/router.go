package main

import (
	"errors"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/prompt"
)

// destinationHeader carries the chosen endpoint to Envoy's override-host
// load-balancing policy (the Gateway API Inference Extension's name for it).
const destinationHeader = "x-gateway-destination-endpoint"

// ownedHeaders are removed from every request before anything else happens:
// each of them can steer the upstream, and only the filter may set them.
var ownedHeaders = []string{
	destinationHeader,
	// ORIGINAL_DST clusters read this one by default.
	"x-envoy-original-dst-host",
}

// outcome is what routing made of one request; every outcome other than
// routed is a fallback to Envoy's own load balancing.
type outcome uint8

const (
	routed outcome = iota
	fallbackInvalidBody
	fallbackNoPrompt
	fallbackTooLarge
	fallbackNoEndpoints
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	routed:              "routed",
	fallbackInvalidBody: "invalid_body",
	fallbackNoPrompt:    "no_prompt",
	fallbackTooLarge:    "body_too_large",
	fallbackNoEndpoints: "no_endpoints",
}

func (o outcome) String() string { return outcomeNames[o] }

// router turns a request body into an endpoint. One router serves a whole VM
// (one Envoy worker thread), so its buffers are reused across requests.
type router struct {
	cfg    config
	text   []byte
	hashes []uint64
}

// route picks the endpoint for a complete request body.
func (r *router) route(body []byte) (string, outcome) {
	if len(r.cfg.endpoints) == 0 {
		return "", fallbackNoEndpoints
	}
	p, err := prompt.Render(r.text[:0], body, r.cfg.template)
	if err != nil {
		if errors.Is(err, prompt.ErrNoPrompt) {
			return "", fallbackNoPrompt
		}
		return "", fallbackInvalidBody
	}
	r.text = p.Text[:0]
	seed := blockhash.Seed(p.Model, "")
	r.hashes = blockhash.Append(r.hashes[:0], seed, p.Text, r.cfg.hashing)
	return r.cfg.endpoints[policy.Rendezvous(r.affinityKey(seed, p.Text), r.cfg.endpoints)], routed
}

// affinityKey names the prompt's leading span of cfg.affinityBlocks blocks
// (or all its full blocks if it has fewer). Not just the first block: chat
// templates open every prompt with the same boilerplate (Qwen's default
// system prompt fills more than one block), so the first block alone would
// send every request to one endpoint.
func (r *router) affinityKey(seed uint64, text []byte) uint64 {
	if n := len(r.hashes); n > 0 {
		return r.hashes[min(n, r.cfg.affinityBlocks)-1]
	}
	if len(text) > 0 {
		// A prompt shorter than one block still deserves a stable home.
		return blockhash.Next(seed, text)
	}
	return seed
}
