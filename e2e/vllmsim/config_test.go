package vllmsim

import (
	"context"
	"strings"
	"testing"
)

func TestConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"context above cache", func(c *Config) { c.NumGPUBlocks, c.MaxModelLen = 9, 1000 }, "larger than the 128 tokens"},
		{"one block", func(c *Config) { c.NumGPUBlocks = 1 }, "at least 2"},
		{"negative time scale", func(c *Config) { c.TimeScale = -1 }, "negative"},
		{"negative cost", func(c *Config) { c.Cost = DefaultCostModel; c.Cost.Step = -1 }, "non-negative"},
		{"publisher", func(c *Config) { c.KVEvents.Publisher = "kafka" }, "publisher"},
		{"encoding", func(c *Config) { c.Encoding = 9 }, "encoding"},
		{"lora named as the model", func(c *Config) { c.LoRAModules = []LoRAModule{{Name: DefaultModel, Path: "x"}} }, "repeated"},
		{"unknown template", func(c *Config) { c.ChatTemplate = "alpaca" }, "unknown chat template"},
		{"broken template", func(c *Config) { c.ChatTemplate = "{% for %}" }, "compile chat template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.edit(&cfg)
			e, err := Start(context.Background(), cfg)
			if err == nil {
				e.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want %q", err, tt.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxModelLen != DefaultMaxModelLen || c.KVEvents.Publisher != "null" || c.KVEvents.Endpoint != "tcp://*:5557" || c.Cost != DefaultCostModel {
		t.Fatalf("%+v", c)
	}
	c, _ = Config{NumGPUBlocks: 33, KVEvents: KVEventsConfig{EnableKVCacheEvents: true}}.withDefaults()
	if c.MaxModelLen != 512 || c.KVEvents.Publisher != "zmq" {
		t.Fatalf("max model len %d, publisher %q", c.MaxModelLen, c.KVEvents.Publisher)
	}
	if _, err := ParseLoRAModule("sql=/a/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseLoRAModule("sql"); err == nil {
		t.Fatal("lora module without path accepted")
	}
}
