package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gpuscaler/gpuscaler/internal/version"
)

func runVersion(_ context.Context, args []string, env envFunc, stdout, _ io.Writer) error {
	fs := newFlagSet("version", "version", "Prints the version, commit, Go version and platform of this build.", stdout)
	if err := parseFlags(fs, args, env); err != nil {
		return err
	}
	fmt.Fprintln(stdout, version.String())
	return nil
}
