// Command pulumi-nodejs-codegen is the code generator of the stand-in Node.js language host
// (tools/langhost_nodejs.py), for machines whose Go module proxy does not serve the official
// pulumi-language-nodejs.
//
// Why a Go program: the CLI does not generate SDKs itself, it asks the project language's host
// (the GeneratePackage RPC of `pulumi package add` and `pulumi package gen-sdk`), and the
// TypeScript code generator exists only as Go, in the CLI's own module
// (github.com/pulumi/pulumi/pkg/v3/codegen/nodejs, the version the CLI is built from). The
// Python host serves the RPC and hands the request over: a serialized
// pulumirpc.GeneratePackageRequest on stdin; the serialized GeneratePackageResponse (its
// diagnostics) on stdout, exit 0; any other failure on stderr, exit 1. The schema is bound as
// the official host binds it (dangling references allowed, other packages from the CLI's
// schema loader at the request's loader_target) and the files are written under the request's
// directory.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/protobuf/proto"
)

// The tool name the generated files' headers carry, as with the official host.
const toolName = "pulumi-language-nodejs"

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-nodejs-codegen: %v\n", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	var req pulumirpc.GeneratePackageRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		return fmt.Errorf("decoding the request: %w", err)
	}
	resp, err := generate(&req)
	if err != nil {
		return err
	}
	data, err := proto.Marshal(resp)
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}

func generate(req *pulumirpc.GeneratePackageRequest) (*pulumirpc.GeneratePackageResponse, error) {
	client, err := schema.NewLoaderClient(req.LoaderTarget)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	loader := schema.NewCachedLoader(client)

	var spec schema.PackageSpec
	if err := json.Unmarshal([]byte(req.Schema), &spec); err != nil {
		return nil, err
	}
	pkg, diags, err := schema.BindSpec(spec, loader, schema.ValidationOptions{AllowDanglingReferences: true})
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GeneratePackageResponse{Diagnostics: plugin.HclDiagnosticsToRPCDiagnostics(diags)}
	if diags.HasErrors() {
		return resp, nil
	}
	files, err := nodejs.GeneratePackage(toolName, pkg, req.ExtraFiles, req.LocalDependencies, req.Local, loader)
	if err != nil {
		return nil, err
	}
	for name, data := range files {
		path := filepath.Join(req.Directory, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("could not create output directory %s: %w", filepath.Dir(name), err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("could not write output file %s: %w", name, err)
		}
	}
	return resp, nil
}
