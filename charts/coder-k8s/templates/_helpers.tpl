{{/*
Names. Every object name derives from coder-k8s.fullname; the config file,
the RBAC rules and the Services use the same helpers, so they always agree.
*/}}
{{- define "coder-k8s.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coder-k8s.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A name derived from the full name: (list . "suffix"). Kept within 63 characters. */}}
{{- define "coder-k8s.child" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (include "coder-k8s.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}

{{- define "coder-k8s.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coder-k8s.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coder-k8s.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "coder-k8s.labels" -}}
helm.sh/chart: {{ include "coder-k8s.chart" . }}
{{ include "coder-k8s.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: coder-k8s
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "coder-k8s.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "coder-k8s.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Object names shared by several templates and the config file. */}}
{{- define "coder-k8s.aggregatedServiceName" -}}{{ include "coder-k8s.child" (list . "aggregated") }}{{- end -}}
{{- define "coder-k8s.mcpServiceName" -}}{{ include "coder-k8s.child" (list . "mcp") }}{{- end -}}
{{- define "coder-k8s.metricsServiceName" -}}{{ include "coder-k8s.child" (list . "metrics") }}{{- end -}}
{{- define "coder-k8s.autoTLSSecretName" -}}{{ include "coder-k8s.child" (list . "aggregated-tls") }}{{- end -}}
{{- define "coder-k8s.certManagerSecretName" -}}{{ include "coder-k8s.child" (list . "aggregated-cert") }}{{- end -}}
{{- define "coder-k8s.coderTokenSecretName" -}}
{{- if .Values.staticBackend.existingSecret -}}
{{- .Values.staticBackend.existingSecret -}}
{{- else -}}
{{- include "coder-k8s.child" (list . "coder-token") -}}
{{- end -}}
{{- end -}}
{{- define "coder-k8s.apiServiceName" -}}v1alpha1.aggregation.coder.com{{- end -}}

{{/* Workspace RBAC: the ClusterRoles the operator binds, as in the config file. */}}
{{- define "coder-k8s.workspaceClusterRole" -}}
{{- .Values.workspaceRBAC.clusterRole | default (include "coder-k8s.child" (list . "workspace")) -}}
{{- end -}}
{{- define "coder-k8s.workspaceDeploymentsClusterRole" -}}
{{- .Values.workspaceRBAC.deploymentsClusterRole | default (include "coder-k8s.child" (list . "workspace-deployments")) -}}
{{- end -}}
{{/* Every ClusterRole the operator may bind, deduplicated, as a JSON list. */}}
{{- define "coder-k8s.bindableClusterRoles" -}}
{{- $roles := list (include "coder-k8s.workspaceClusterRole" .) (include "coder-k8s.workspaceDeploymentsClusterRole" .) -}}
{{- range .Values.workspaceRBAC.allowedClusterRoles }}{{ $roles = append $roles . }}{{ end -}}
{{- $roles | uniq | toJson -}}
{{- end -}}

{{/* The leader-election Lease: name and namespace, as in the config file. */}}
{{- define "coder-k8s.leaseName" -}}
{{- $le := dig "controller" "leaderElection" dict (.Values.config | default dict) -}}
{{- $le.leaseName | default (include "coder-k8s.child" (list . "leader")) -}}
{{- end -}}
{{- define "coder-k8s.leaseNamespace" -}}
{{- $le := dig "controller" "leaderElection" dict (.Values.config | default dict) -}}
{{- $le.namespace | default .Release.Namespace -}}
{{- end -}}
{{- define "coder-k8s.leaderElection" -}}
{{- $le := dig "controller" "leaderElection" dict (.Values.config | default dict) -}}
{{- if or (not (hasKey $le "enabled")) $le.enabled }}true{{ end -}}
{{- end -}}

{{/* What the mode runs: "true" or "". */}}
{{- define "coder-k8s.runsController" -}}
{{- if has .Values.mode (list "all" "controller") }}true{{ end -}}
{{- end -}}
{{- define "coder-k8s.runsAggregated" -}}
{{- if has .Values.mode (list "all" "aggregated-apiserver") }}true{{ end -}}
{{- end -}}
{{- define "coder-k8s.runsMCP" -}}
{{- if has .Values.mode (list "all" "mcp-http") }}true{{ end -}}
{{- end -}}
{{- define "coder-k8s.servesMetrics" -}}
{{- if .Values.metrics.enabled }}true{{ end -}}
{{- end -}}

{{/* Mount paths. */}}
{{- define "coder-k8s.configDir" -}}/etc/coder-k8s{{- end -}}
{{- define "coder-k8s.certDir" -}}/var/run/coder-k8s/tls{{- end -}}
{{- define "coder-k8s.coderTokenDir" -}}/var/run/coder-k8s/coder-token{{- end -}}

{{/* The serving certificate's Secret in modes certManager and secret; "" otherwise. */}}
{{- define "coder-k8s.tlsSecretName" -}}
{{- if eq .Values.tls.mode "certManager" -}}
{{- include "coder-k8s.certManagerSecretName" . -}}
{{- else if eq .Values.tls.mode "secret" -}}
{{- required "tls.secret.name is required when tls.mode is secret" .Values.tls.secret.name -}}
{{- end -}}
{{- end -}}

{{/* The static backend is on when staticBackend.url is set. */}}
{{- define "coder-k8s.staticBackend" -}}
{{- if .Values.staticBackend.url -}}
{{- if not (include "coder-k8s.runsAggregated" .) -}}
{{- fail (printf "staticBackend.url is set but mode %s runs no aggregated API server: use mode all or aggregated-apiserver, or leave staticBackend.url empty" .Values.mode) -}}
{{- end -}}
{{- if not (or .Values.staticBackend.existingSecret .Values.staticBackend.sessionToken) -}}
{{- fail "staticBackend.url is set: its session token must come from staticBackend.existingSecret or staticBackend.sessionToken" -}}
{{- end -}}
true
{{- else -}}
{{- if eq .Values.mode "aggregated-apiserver" -}}
{{- fail "mode aggregated-apiserver needs a static backend: set staticBackend.url and staticBackend.existingSecret (or staticBackend.sessionToken)" -}}
{{- end -}}
{{- if or .Values.staticBackend.existingSecret .Values.staticBackend.sessionToken -}}
{{- fail "staticBackend.existingSecret or staticBackend.sessionToken is set but staticBackend.url is empty" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The configuration file. values.config minus nothing (the schema refuses the
keys the chart owns), plus apiVersion/kind when omitted, plus the mode,
listen addresses, TLS, static backend and cluster controllers rendered from
their values.
*/}}
{{- define "coder-k8s.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $_ := set $cfg "apiVersion" ($cfg.apiVersion | default "config.coder.com/v1alpha1") -}}
{{- $_ := set $cfg "kind" ($cfg.kind | default "CoderK8sConfiguration") -}}
{{- $_ := set $cfg "app" .Values.mode -}}
{{- /* controller */ -}}
{{- $ctrl := get $cfg "controller" | default dict -}}
{{- $_ := set $cfg "controller" $ctrl -}}
{{- $_ := set $ctrl "healthProbeBindAddress" (printf ":%d" (int .Values.ports.health)) -}}
{{- $_ := set $ctrl "metricsBindAddress" (ternary (printf ":%d" (int .Values.ports.metrics)) "0" .Values.metrics.enabled) -}}
{{- $le := get $ctrl "leaderElection" | default dict -}}
{{- $_ := set $ctrl "leaderElection" $le -}}
{{- $_ := set $le "leaseName" (include "coder-k8s.leaseName" .) -}}
{{- if include "coder-k8s.runsController" . -}}
{{- $_ := set $ctrl "workspaceRBAC" (dict
      "clusterRole" (include "coder-k8s.workspaceClusterRole" .)
      "deploymentsClusterRole" (include "coder-k8s.workspaceDeploymentsClusterRole" .)
      "allowedClusterRoles" (.Values.workspaceRBAC.allowedClusterRoles | default list)
      "extraNamespaces" (.Values.workspaceRBAC.extraNamespaces | default list)) -}}
{{- end -}}
{{- /* aggregated API server */ -}}
{{- $agg := get $cfg "aggregatedAPIServer" | default dict -}}
{{- $_ := set $cfg "aggregatedAPIServer" $agg -}}
{{- $_ := set $agg "securePort" (int .Values.ports.aggregatedAPI) -}}
{{- if include "coder-k8s.runsAggregated" . -}}
{{- $_ := set $agg "identity" (dict "clusterControllers" (.Values.aggregatedAPI.clusterControllers | default list)) -}}
{{- $_ := set $agg "admission" (dict "enabled" .Values.aggregatedAPI.admission.enabled) -}}
{{- if eq .Values.tls.mode "auto" -}}
{{- $_ := set $agg "autoTLS" (dict
      "enabled" true
      "secretName" (include "coder-k8s.autoTLSSecretName" .)
      "namespace" .Release.Namespace
      "serviceName" (include "coder-k8s.aggregatedServiceName" .)
      "apiServiceName" (include "coder-k8s.apiServiceName" .)
      "certValidity" .Values.tls.auto.certValidity) -}}
{{- else if include "coder-k8s.tlsSecretName" . -}}
{{- $_ := set $agg "certDir" (include "coder-k8s.certDir" .) -}}
{{- end -}}
{{- if include "coder-k8s.staticBackend" . -}}
{{- $coder := get $agg "coder" | default dict -}}
{{- $_ := set $agg "coder" $coder -}}
{{- $_ := set $coder "staticBackend" (dict
      "url" .Values.staticBackend.url
      "namespace" (.Values.staticBackend.namespace | default .Release.Namespace)
      "sessionTokenFile" (printf "%s/token" (include "coder-k8s.coderTokenDir" .))
      "identity" .Values.staticBackend.identity) -}}
{{- end -}}
{{- end -}}
{{- /* MCP */ -}}
{{- $mcp := get $cfg "mcp" | default dict -}}
{{- $_ := set $cfg "mcp" $mcp -}}
{{- $_ := set $mcp "bindAddress" (printf ":%d" (int .Values.ports.mcp)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The image reference: registry/repository:tag@digest. */}}
{{- define "coder-k8s.image" -}}
{{- $registry := .Values.image.registry -}}
{{- with .Values.global }}{{ with .imageRegistry }}{{ $registry = . }}{{ end }}{{ end -}}
{{- $ref := .Values.image.repository -}}
{{- if $registry -}}{{- $ref = printf "%s/%s" $registry $ref -}}{{- end -}}
{{- $ref = printf "%s:%s" $ref (.Values.image.tag | default .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}{{- $ref = printf "%s@%s" $ref .Values.image.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* A probe of the mode: (list . "liveness"|"readiness"). */}}
{{- define "coder-k8s.probe" -}}
{{- $root := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $v := ternary $root.Values.livenessProbe $root.Values.readinessProbe (eq $kind "liveness") -}}
{{- $path := ternary "/healthz" "/readyz" (eq $kind "liveness") -}}
{{- $port := "" -}}
{{- $scheme := "HTTP" -}}
{{- if eq $root.Values.mode "all" -}}
{{- if eq $kind "liveness" -}}{{- $port = "health" -}}{{- else -}}{{- $port = "aggregated-api" -}}{{- $scheme = "HTTPS" -}}{{- end -}}
{{- else if eq $root.Values.mode "controller" -}}
{{- $port = "health" -}}
{{- else if eq $root.Values.mode "aggregated-apiserver" -}}
{{- $port = "aggregated-api" -}}{{- $scheme = "HTTPS" -}}
{{- else -}}
{{- $port = "mcp" -}}
{{- end -}}
httpGet:
  path: {{ $path }}
  port: {{ $port }}
  scheme: {{ $scheme }}
{{ toYaml $v }}
{{- end -}}
