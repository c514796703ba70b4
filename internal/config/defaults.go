package config

import "time"

// DefaultClusterControllers are the Kubernetes usernames of
// kube-controller-manager's garbage collector and namespace controller:
// their ServiceAccounts (--use-service-account-credentials, as kubeadm
// and managed clusters run it) and its own user (without that flag).
func DefaultClusterControllers() []string {
	return []string{
		"system:serviceaccount:kube-system:generic-garbage-collector",
		"system:serviceaccount:kube-system:namespace-controller",
		"system:kube-controller-manager",
	}
}

// Default returns the fully defaulted configuration. It is the only place
// defaults live; testdata/defaults.golden.yaml pins it so that every change
// to a default shows up in review.
func Default() Configuration {
	return Configuration{
		APIVersion: APIVersion,
		Kind:       Kind,
		App:        AppAll,
		Logging: Logging{
			Level:  "info",
			Format: "json",
		},
		Kubernetes: Kubernetes{
			QPS:   50,
			Burst: 100,
		},
		Controller: Controller{
			HealthProbeBindAddress: ":8081",
			MetricsBindAddress:     ":8080",
			CoderRequestTimeout:    D(30 * time.Second),
			// A token check per control plane every five minutes.
			OperatorAccessCheckInterval: D(5 * time.Minute),
			// Informers see the new token within seconds; requests to
			// coderd end within coderRequestTimeout (30s by default).
			ReplacedTokenRevocationDelay: D(5 * time.Minute),
			LeaderElection: LeaderElection{
				Enabled:       true,
				LeaseName:     "coder-k8s-leader",
				LeaseDuration: D(15 * time.Second),
				RenewDeadline: D(10 * time.Second),
				RetryPeriod:   D(2 * time.Second),
			},
			// The ClusterRoles the chart installs for a release named
			// coder-k8s; the chart renders its own names.
			WorkspaceRBAC: WorkspaceRBAC{
				ClusterRole:            "coder-k8s-workspace",
				DeploymentsClusterRole: "coder-k8s-workspace-deployments",
			},
		},
		AggregatedAPIServer: AggregatedAPIServer{
			BindAddress:    "0.0.0.0",
			SecurePort:     6443,
			RequestTimeout: D(30 * time.Minute),
			TemplateBuildWait: TemplateBuildWait{
				Timeout:             D(25 * time.Minute),
				BackoffAfter:        D(2 * time.Minute),
				InitialPollInterval: D(2 * time.Second),
				MaxPollInterval:     D(10 * time.Second),
			},
			WatchPollInterval: D(5 * time.Second),
			AutoTLS: AutoTLS{
				SecretName:     "coder-k8s-aggregated-tls",
				ServiceName:    "coder-k8s-aggregated",
				APIServiceName: "v1alpha1.aggregation.coder.com",
				CertValidity:   D(365 * 24 * time.Hour),
			},
			Coder: Coder{
				RequestTimeout: D(30 * time.Second),
				StaticBackend:  StaticBackend{Identity: Identity{Mode: "Mapped", MatchBy: "Email"}},
			},
			// Who deletes orphans and empties deleted namespaces in every
			// cluster; see DefaultClusterControllers.
			Identity: AggregatedIdentity{ClusterControllers: DefaultClusterControllers()},
			// The cluster's policies apply to coder-k8s's kinds as to
			// every other kind.
			Admission: AggregatedAdmission{Enabled: true},
		},
		MCP: MCP{
			BindAddress:       ":8090",
			Auth:              MCPAuthKubernetes,
			MaxRequestBytes:   1 << 20,
			ReadHeaderTimeout: D(10 * time.Second),
			ToolTimeout:       D(2 * time.Minute),
		},
	}
}
