//go:build tools

// Package tools names the etcd server main package so `go mod tidy` keeps its dependencies.
package tools

import _ "go.etcd.io/etcd/server/v3"
