// Command pulumi-language-yaml is the YAML language host of github.com/pulumi/pulumi-yaml
// v1.25.0 (its pkg/server), served with one RPC more (Link) and the CLI's schema loader.
//
// Why: the CLI 3.276.0's `pulumi package add` ends by asking the program's language host to
// Link the package, and fails when the host answers Unimplemented. v1.25.0 (the newest release
// the Go module proxy serves, PROVENANCE.md) predates Link; later releases answer it with an
// empty response, since a YAML program names its packages in Pulumi.yaml (`packages:`, which
// the CLI writes itself) and has nothing to link. That is all this adds. The command line is
// upstream's: [-tracing URL] [-root DIR] [ENGINE_ADDRESS], the port printed on stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/pulumi/pulumi-yaml/pkg/server"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
)

// host is the released YAML host with Link answered.
type host struct {
	pulumirpc.LanguageRuntimeServer
}

// Link has nothing to do for YAML: Pulumi.yaml's `packages:` is the link.
func (host) Link(context.Context, *pulumirpc.LinkRequest) (*pulumirpc.LinkResponse, error) {
	return &pulumirpc.LinkResponse{}, nil
}

func main() {
	tracing := flag.String("tracing", "", "emit tracing to a Zipkin-compatible endpoint")
	flag.String("root", "", "root of the program execution (unused)")
	flag.String("compiler", "", "obsolete")
	flag.Parse()
	logging.InitLogging(false, 0, false)
	cmdutil.InitTracing("pulumi-language-yaml", "pulumi-language-yaml", *tracing)

	var engineAddress string
	var cancel chan bool
	if args := flag.Args(); len(args) > 0 {
		engineAddress = args[0]
		// Stop serving when the engine goes away or on SIGINT (the CLI's stop).
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		cancel = make(chan bool)
		go func() {
			<-ctx.Done()
			stop()
			close(cancel)
		}()
		if err := rpcutil.Healthcheck(ctx, engineAddress, 5*time.Minute, stop); err != nil {
			cmdutil.Exit(fmt.Errorf("could not start health check host RPC server: %w", err))
		}
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			// Schemas through the CLI's loader (RunRequest.loader_target), not through a plugin
			// host of the release's own pkg/v3 v3.206.0: that one asks a provider for
			// GetPluginInfo first, which the Python SDK 3.272's providers do not serve
			// ("could not read plugin ...: Method not implemented!"). The release's own tests
			// run the host so (cmd/pulumi-language-yaml/language_test.go).
			released := server.NewLanguageHost(engineAddress, *tracing, true /* useRPCLoader */)
			pulumirpc.RegisterLanguageRuntimeServer(srv, host{released})
			return nil
		},
	})
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not start language host RPC server: %w", err))
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		cmdutil.Exit(fmt.Errorf("language host RPC stopped serving: %w", err))
	}
}
