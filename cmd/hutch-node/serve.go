package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/kubenode/nodesvc"
)

// serve runs the node service until SIGTERM or SIGINT.
func serve(args []string) (int, error) {
	fl := flag.NewFlagSet("hutch-node serve", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	keyFile := fl.String("key-file", "", "the node key: a file of 64 hex digits")
	listen := fl.String("listen", ":"+strconv.Itoa(kubenode.Port), "the address to listen on")
	sock := fl.String("containerd", nodesvc.DefaultContainerd, "containerd's socket")
	dir := fl.String("checkpoint-dir", nodesvc.DefaultDir, "where checkpoints go on the host (the shim's checkpoint_dir)")
	root := fl.String("host-root", "/", "where the host's / is mounted here")
	if err := fl.Parse(args); err != nil {
		return 2, fmt.Errorf("serve: %v: %w", err, errUsage)
	}
	if fl.NArg() != 0 {
		return 2, fmt.Errorf("serve: unexpected argument %q: %w", fl.Arg(0), errUsage)
	}
	if *keyFile == "" {
		return 2, fmt.Errorf("serve: --key-file is required: %w", errUsage)
	}
	key, err := kubenode.ReadKeyFile(*keyFile)
	if err != nil {
		return 2, err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return 1, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() { <-ctx.Done(); l.Close() }()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("node service listening", "addr", l.Addr().String(), "containerd", *sock, "checkpoint-dir", *dir, "host-root", *root)
	s := &nodesvc.Server{Key: key, Containerd: *sock, Dir: *dir, Root: *root, Log: log}
	err = s.Serve(l)
	if ctx.Err() != nil {
		return 0, nil
	}
	return 1, err
}
