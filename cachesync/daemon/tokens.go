package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// tokenFilePoll is how often the report token file is checked for a new
// set of tokens. A Kubernetes Secret volume updates its files in place
// within about a minute; a few seconds more does not matter.
const tokenFilePoll = 5 * time.Second

// readTokens reads a token file: one token per line, blank lines and lines
// starting with # ignored. Several tokens are all accepted, which is how a
// token is rotated: add the new one, move the gateways, remove the old.
func readTokens(path string) ([]string, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("report token file: %w", err)
	}
	var tokens []string
	for line := range strings.Lines(string(b)) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			tokens = append(tokens, t)
		}
	}
	return tokens, b, nil
}

// tokens returns what the gateways may present: the flag's token and the
// file's.
func (d *Daemon) tokens(file []string) []string {
	if d.cfg.ReportToken == "" {
		return file
	}
	return append([]string{d.cfg.ReportToken}, file...)
}

// watchTokens reloads the report token file when its contents change. A
// file that cannot be read keeps the tokens last read, and is logged once
// until it can be read again.
func (d *Daemon) watchTokens(ctx context.Context, last []byte) error {
	t := time.NewTicker(d.tokenPoll)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		file, raw, err := readTokens(d.cfg.ReportTokenFile)
		if err != nil {
			if !failing {
				d.log.Warn("keeping the report tokens last read", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			d.log.Info("report token file readable again", "path", d.cfg.ReportTokenFile)
		}
		failing = false
		if bytes.Equal(raw, last) {
			continue
		}
		last = raw
		tokens := d.tokens(file)
		d.svc.SetTokens(tokens...)
		d.log.Info("report tokens reloaded", "path", d.cfg.ReportTokenFile, "tokens", len(tokens))
		if len(tokens) == 0 {
			d.log.Warn("no report token: POST /v1/reports is disabled and the snapshot is open to anyone who reaches the port")
		}
	}
}
