// Command opa is OPA's own CLI, built from the pinned module in go.mod so that the project
// compiles Rego with the official compiler without downloading a prebuilt binary.
// See docs/adr/0001-opa-compiler-from-source.md.
package main

import (
	"errors"
	"os"

	"github.com/open-policy-agent/opa/cmd"
)

func main() {
	exit := 0
	if err := cmd.RootCommand.Execute(); err != nil {
		var e *cmd.ExitError
		if errors.As(err, &e) {
			exit = e.Exit
		} else {
			exit = 1
		}
	}
	os.Exit(exit)
}
