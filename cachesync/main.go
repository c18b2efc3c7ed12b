// Command cachesync is kvroute's companion daemon: it discovers inference
// engines, follows their KV-cache events and metrics, and serves the
// prefix-index and load snapshot that kvroute's Envoy filter routes on.
//
//	cachesync -engines 10.0.0.1:8000?events=5557&replay=5558 -tokenizer cl100k_base -report-token-file /run/token
//	cachesync calibrate -url http://10.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/cachesync/daemon"
	"github.com/kvroute/kvroute/cachesync/internal/calibrate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "cachesync:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "calibrate" {
		return calibrate.Command(ctx, args[1:], os.Stdout, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	}
	cfg, err := daemon.ParseFlags(args, os.Getenv)
	if err != nil {
		return err
	}
	log := cfg.Logger(os.Stderr)
	d, err := daemon.New(cfg, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
