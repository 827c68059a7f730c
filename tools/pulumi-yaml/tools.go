//go:build tools

// Package tools names the YAML language host's main package so `go mod tidy` keeps its
// dependencies.
package tools

import _ "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml"
