//go:build tools

// Package tools names the kwok commands so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
