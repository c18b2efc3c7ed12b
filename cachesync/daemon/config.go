package daemon

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
	"github.com/kvroute/kvroute/cachesync/internal/discovery"
	"github.com/kvroute/kvroute/cachesync/internal/index"
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/shared/approx"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// Config is the daemon's configuration: flags, each of which can also come
// from the environment as CACHESYNC_<FLAG> (upper case, dashes as
// underscores); a flag on the command line wins.
type Config struct {
	Listen string // address of the HTTP API

	// Discovery: exactly one of these.
	Engines    string // static list, discovery.ParseStatic syntax
	DNSName    string // A/AAAA (with DNSPort) or SRV (DNSPort 0) records of a headless Service
	DNSPort    int
	K8sService string // namespace/name of a Service whose EndpointSlices list the engines
	// K8sInferencePool is namespace/name of an InferencePool whose
	// selected pods are the engines.
	K8sInferencePool string
	K8sPort          string // port name in the slices; "" takes the only port
	Kubeconfig       string // "" means in-cluster configuration
	Events           discovery.EventPorts
	Topic            string // KV-event topic prefix to subscribe to

	// Tokenizer makes the index precise for engines with KV events: a
	// tokenizer.json, a model directory, a tiktoken file or a built-in
	// encoding name. Without it every engine is indexed approximately.
	Tokenizer string
	// ChatTemplateFile lists chat templates kvroute has no name for,
	// comma-separated: each engine is checked against them, the one a
	// gateway on chat_template custom names is the one its engines must
	// agree with, and for gateways on auto each model's engines' template
	// is shipped. Each is a tokenizer_config.json, or a .jinja file (special
	// tokens then from a tokenizer_config.json beside it). Empty: the
	// template beside Tokenizer, if there is one.
	ChatTemplateFile string
	Hash             blockhash.Config // must match the filters' block_size and max_blocks

	SyncInterval time.Duration // snapshot build interval
	ReportToken  string        // bearer token gateways send with reports and snapshot requests
	// ReportTokenFile holds more tokens, one per line, reloaded when it
	// changes. With neither, reports are disabled and the snapshot is open.
	ReportTokenFile string
	// Peers are the other cachesync replicas' API addresses, to which the
	// gateways' report batches are forwarded.
	Peers          string
	ScrapeInterval time.Duration
	ScrapeMisses   int
	Calibration    calibrate.Config
	BytesPerToken  float64 // sizes approximate indexes from KV capacity; published to the filters in the snapshot
	// LearnBytesPerToken sizes each approximate index by the ratio learned
	// for its engine's model (package tokenbytes) once there is one;
	// BytesPerToken stands until then.
	LearnBytesPerToken bool
	// PendingTTL, when positive, makes the blocks a routing report names
	// for a precise endpoint count until its events confirm them, for that
	// long (index.Config.PendingTTL); 0 leaves them to the events alone.
	PendingTTL time.Duration
	// MoveGroups turns on the planner: prompt groups are moved between a
	// deployment's engines to spread their decoding. The flag defaults to
	// on; the zero Config leaves it off.
	MoveGroups bool
	// MoveCooldown is the least time between two moves of prompt groups
	// in a deployment (planner.Config.Cooldown); 0 means the planner's
	// default (30 s).
	MoveCooldown time.Duration
	// TemplateCheck is how often each engine with KV events is asked to
	// render the probe set, to check its chat template against the
	// gateways'; 0 means DefaultTemplateCheck, negative never.
	TemplateCheck time.Duration

	LogFormat string // "text" or "json"
	LogLevel  slog.Level
}

// ParseFlags reads args (without the program name) and the environment.
func ParseFlags(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("cachesync", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "address of the snapshot and report API")
	fs.StringVar(&c.Engines, "engines", "", "static engine list: ip:port[?events=PORT|listen&replay=PORT&dp=N],...")
	fs.StringVar(&c.DNSName, "dns-name", "", "discover engines from DNS: a headless Service name (A/AAAA with -dns-port, SRV without)")
	fs.IntVar(&c.DNSPort, "dns-port", 0, "engines' HTTP port for A/AAAA discovery; 0 reads SRV records")
	fs.StringVar(&c.K8sService, "k8s-service", "", "discover engines from the EndpointSlices of this Service (namespace/name)")
	fs.StringVar(&c.K8sPort, "k8s-port", "", "port name of the engines' HTTP port in the EndpointSlices")
	fs.StringVar(&c.K8sInferencePool, "k8s-inference-pool", "", "discover engines from this InferencePool (inference.networking.k8s.io/v1, namespace/name): the pods its selector matches, on its target port")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.IntVar(&c.Events.Pub, "events-port", 0, "KV-event PUB port on each engine's IP, for publishers that bind (vLLM's default endpoint tcp://*:5557); 0 means none")
	fs.StringVar(&c.Events.Listen, "events-listen", "", "endpoint cachesync binds for KV-event publishers that connect (a vLLM endpoint naming a host), e.g. tcp://0.0.0.0:5557; engines are told apart by topic kv@<ip>@<model>")
	fs.IntVar(&c.Events.Replay, "replay-port", 0, "engines' KV-event replay port; 0 means none")
	fs.IntVar(&c.Events.DPSize, "dp-size", 0, "data-parallel ranks per engine (ports are offset by the rank)")
	fs.StringVar(&c.Topic, "topic", "", "KV-event topic prefix to subscribe to")
	fs.StringVar(&c.Tokenizer, "tokenizer", "", "engines' vocabulary for the precise index: tokenizer.json, model dir, tiktoken file or cl100k_base/o200k_base")
	fs.StringVar(&c.ChatTemplateFile, "chat-template-file", "", "chat templates kvroute has no name for, comma-separated, to check engines against and ship to gateways on auto (each model's engines' own): each a tokenizer_config.json, or a .jinja file (special tokens from a tokenizer_config.json beside it); default: the one beside -tokenizer")
	fs.IntVar(&c.Hash.BlockSize, "block-size", blockhash.DefaultBlockSize, "text block size in bytes; must match the filters")
	fs.IntVar(&c.Hash.MaxBlocks, "max-blocks", blockhash.DefaultMaxBlocks, "blocks hashed per prompt at most; must match the filters")
	fs.DurationVar(&c.SyncInterval, "sync-interval", index.DefaultInterval, "least time between snapshot builds")
	fs.StringVar(&c.ReportToken, "report-token", "", "bearer token gateways present with routing reports and snapshot requests; with no token, reports are disabled and the snapshot is open")
	fs.StringVar(&c.Peers, "peers", "", "the other cachesync replicas' API addresses (host:port,...): every report batch a gateway sends here is forwarded to each, so that all replicas learn every decision")
	fs.StringVar(&c.ReportTokenFile, "report-token-file", "", "file of accepted tokens, one per line (# comments), reloaded when it changes: rotate by adding the new token, moving the gateways, removing the old")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", scrape.DefaultInterval, "time between metric scrapes of an engine")
	fs.IntVar(&c.ScrapeMisses, "scrape-misses", scrape.DefaultMisses, "failed scrapes in a row before an engine is unhealthy")
	fs.Float64Var(&c.Calibration.Default, "prefill-rate", calibrate.DefaultRate, "prefill tokens/s assumed until calibrated")
	fs.Float64Var(&c.Calibration.Ceiling, "prefill-rate-max", 0, "highest calibrated prefill rate accepted (default 4x -prefill-rate)")
	fs.BoolVar(&c.MoveGroups, "move-groups", true, "move prompt groups between a deployment's engines to spread their decoding, each move waiting for room on its target (policy item 11 in the README); -move-groups=false routes each group where its first request went")
	fs.DurationVar(&c.MoveCooldown, "move-cooldown", 30*time.Second, "with -move-groups: least time between two moves in a deployment; the first waits twice this after its first demand")
	fs.DurationVar(&c.PendingTTL, "pending-ttl", 0, "experimental: how long a block a routing report names for an engine with KV events counts before the engine's events confirm it (0: off; the benchmark runs 10s)")
	fs.Float64Var(&c.BytesPerToken, "bytes-per-token", approx.DefaultBytesPerToken, "text bytes per token: sizes approximate indexes (until -learn-bytes-per-token has learned one), and the filters estimate prompt tokens by it (sent in the snapshot)")
	fs.BoolVar(&c.LearnBytesPerToken, "learn-bytes-per-token", true, "size each approximate index by the bytes per token learned for its model from the gateways' reports and the engines' prompt-token counters")
	fs.DurationVar(&c.TemplateCheck, "template-check", DefaultTemplateCheck, "how often each engine with KV events renders a probe set through its /tokenize, to check its chat template against the gateways' (an engine that disagrees is indexed approximately); negative: never")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")

	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		env := "CACHESYNC_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" && !set[f.Name] && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s: %w", env, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if err := c.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("log-level: %w", err)
	}
	return c, c.Validate()
}

// Validate reports the first setting that cannot work, naming it.
func (c *Config) Validate() error {
	sources := 0
	for _, s := range []string{c.Engines, c.DNSName, c.K8sService, c.K8sInferencePool} {
		if s != "" {
			sources++
		}
	}
	switch {
	case sources != 1:
		return errors.New("discovery: give exactly one of -engines, -dns-name, -k8s-service, -k8s-inference-pool")
	case c.K8sService != "" && strings.Count(c.K8sService, "/") != 1:
		return errors.New("k8s-service: want namespace/name")
	case c.K8sInferencePool != "" && strings.Count(c.K8sInferencePool, "/") != 1:
		return errors.New("k8s-inference-pool: want namespace/name")
	case c.peersInvalid() != "":
		return errors.New("peers: " + c.peersInvalid() + " is not host:port")
	case c.DNSPort < 0 || c.DNSPort > 65535:
		return errors.New("dns-port: want 0 to 65535")
	case c.Hash.BlockSize < 1 || c.Hash.MaxBlocks < 1:
		return errors.New("block-size and max-blocks must be positive")
	case c.SyncInterval < 10*time.Millisecond:
		return errors.New("sync-interval: want at least 10ms")
	case c.ScrapeInterval < 10*time.Millisecond || c.ScrapeMisses < 1:
		return errors.New("scrape-interval must be at least 10ms and scrape-misses at least 1")
	case !(c.BytesPerToken > 0 && c.BytesPerToken <= snapshot.MaxBytesPerToken):
		return errors.New("bytes-per-token must be above 0 and at most 64")
	case c.LogFormat != "text" && c.LogFormat != "json":
		return errors.New("log-format: want text or json")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := c.Events.Validate(); err != nil {
		return err
	}
	if _, err := c.Calibration.WithDefaults(); err != nil {
		return err
	}
	return nil
}

// Logger returns the logger the configuration asks for.
func (c *Config) Logger(w *os.File) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// peers splits -peers.
func (c *Config) peers() []string { return list(c.Peers) }

// chatTemplateFiles is -chat-template-file's paths.
func (c *Config) chatTemplateFiles() []string { return list(c.ChatTemplateFile) }

// list splits a comma-separated flag, dropping empty entries.
func list(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// peersInvalid returns the first -peers entry that is not host:port.
func (c *Config) peersInvalid() string {
	for _, p := range c.peers() {
		if _, port, err := net.SplitHostPort(p); err != nil || port == "" {
			return p
		}
	}
	return ""
}
