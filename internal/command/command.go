// Package command is coder-k8s's command line: running the operator (the
// root command), `config validate`, `config defaults` and `version`.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/app"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/logging"
	"github.com/coder/coder-k8s/internal/version"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// Execute runs the command line with args and returns the process exit
// code. ctx is cancelled on SIGTERM/SIGINT.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "error:", err)
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) || errors.Is(err, errUsage) {
		return exitUsage
	}
	return exitFailure
}

var errUsage = errors.New("usage")

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "coder-k8s",
		Short: "Kubernetes operator for Coder: controller, aggregated API server and MCP server",
		Long: `coder-k8s runs the components its configuration file selects (app: all,
controller, aggregated-apiserver or mcp-http). Settings come from built-in
defaults, then the file given with --config, then environment variables,
then flags set on the command line.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load(cmd)
			if err != nil {
				return err
			}
			log, flush, err := logging.New(logging.Options{Level: cfg.Logging.Level, Format: cfg.Logging.Format})
			if err != nil {
				return err
			}
			defer flush()
			logging.Install(log)
			log.Info("starting", "version", version.Get().Version, "app", cfg.App)
			for _, w := range cfg.Warnings {
				log.Info("configuration warning: " + w)
			}
			if err := app.Run(cmd.Context(), cfg, log); err != nil {
				log.Error(err, "stopped with an error")
				return err
			}
			log.Info("stopped")
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("%w: %v", errUsage, err)
	})
	config.AddFlags(root.PersistentFlags())
	root.AddCommand(newConfigCommand(), newVersionCommand())
	return root
}

func load(cmd *cobra.Command) (*config.Configuration, error) {
	file, err := cmd.Flags().GetString(config.FlagConfig)
	if err != nil {
		return nil, err
	}
	return config.Load(config.Source{File: file, Flags: cmd.Flags()})
}

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Inspect and check configuration files",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "validate",
		Short: "Check a configuration (file, environment and flags) without starting anything",
		Long: `validate loads the configuration exactly as the operator would and reports
every problem with its field path. It exits 0 when the configuration is valid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := load(cmd)
			if err != nil {
				return err
			}
			for _, w := range cfg.Warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "configuration is valid (app: %s)\n", cfg.App)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "defaults",
		Short: "Print the fully defaulted configuration file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out, err := yaml.Marshal(config.Default())
			if err != nil {
				return fmt.Errorf("render defaults: %w", err)
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	})
	return cmd
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), version.Get())
			return nil
		},
	}
}
