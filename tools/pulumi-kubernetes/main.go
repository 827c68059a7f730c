// Command pulumi-resource-kubernetes serves the Kubernetes provider.
//
// Upstream's main embeds schema-embed.json and terraform-mapping-embed.json, which
// `go generate` writes and the module zip does not contain. tools/build.sh writes them here
// from the schema.json and terraform-mapping.json shipped in the module, with the version set.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
