package vllmsim

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func BenchmarkEncode(b *testing.B) {
	tok, err := loadTokenizer()
	if err != nil {
		b.Fatal(err)
	}
	text := longPrompt("bench", 8000)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.encode(text)
	}
}

// BenchmarkChatRequest measures the simulator's own cost per request: HTTP,
// template, tokenizer, cache and scheduler, with pacing off.
func BenchmarkChatRequest(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprint(n, "-token prompt"), func(b *testing.B) {
			es, err := StartN(context.Background(), 1, Config{NumGPUBlocks: 4096, Logger: discardLogger()})
			if err != nil {
				b.Fatal(err)
			}
			defer es[0].Close()
			body := string(chatBody(longPrompt("bench", n), 16))
			for b.Loop() {
				resp, err := http.Post(es[0].URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil || resp.StatusCode != 200 {
					b.Fatal(err, resp)
				}
				resp.Body.Close()
			}
		})
	}
}
