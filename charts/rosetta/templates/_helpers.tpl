{{/* Chart name, truncated to 63 characters (a label value). */}}
{{- define "rosetta.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: RELEASE-rosetta, or RELEASE when it already contains the chart name. */}}
{{- define "rosetta.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rosetta.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "rosetta.labels" -}}
helm.sh/chart: {{ include "rosetta.chart" . }}
{{ include "rosetta.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rosetta
{{- end }}

{{/* The operator's pods. The component label keeps them apart from training pods, which carry
     app.kubernetes.io/name=rosetta and app.kubernetes.io/managed-by=rosetta-operator. */}}
{{- define "rosetta.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rosetta.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rosetta.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rosetta.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rosetta.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The trainer image of specs without spec.image: the operator's tag unless it has its own. */}}
{{- define "rosetta.trainerImage" -}}
{{- printf "%s:%s" .Values.trainer.image.repository (.Values.trainer.image.tag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* "true" when kopf peering is on: asked for, or needed by more than one replica. */}}
{{- define "rosetta.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The admin policy file (`rosetta operator --policy`): the `policy` values that limit something,
     as YAML; empty when none does, and then the operator runs without a policy. Booleans that
     default to true are limits when false; any other value is a limit when set (an empty list and
     null are not). */}}
{{- define "rosetta.policy" -}}
{{- $permissive := dict "allowServiceAccountToken" true "allowTolerateAll" true "allowRootGroup" true }}
{{- $set := dict }}
{{- range $key, $value := .Values.policy }}
{{- if hasKey $permissive $key }}
{{- if not (eq $value (get $permissive $key)) }}{{ $_ := set $set $key $value }}{{ end }}
{{- else if and (not (kindIs "invalid" $value)) (or (not (kindIs "slice" $value)) $value) }}
{{- $_ := set $set $key $value }}
{{- end }}
{{- end }}
{{- if $set }}{{ toYaml $set }}{{ end }}
{{- end }}

{{/* What the operator does inside a watched namespace (handlers.py, plus kopf itself). */}}
{{- define "rosetta.namespacedRules" -}}
# TranslationTrainings: watched; kopf keeps its progress and diff base in annotations (patch).
- apiGroups: [rosetta.dev]
  resources: [translationtrainings]
  verbs: [get, list, watch, patch]
- apiGroups: [rosetta.dev]
  resources: [translationtrainings/status]
  verbs: [get, patch]
# Children carry ownerReferences with blockOwnerDeletion, which clusters with the
# OwnerReferencesPermissionEnforcement admission plugin only allow to who may update this.
- apiGroups: [rosetta.dev]
  resources: [translationtrainings/finalizers]
  verbs: [update]
# The JobSet: created once, read and watched, patched for spec.suspend (and the annotation that
# records it). Never deleted: garbage collection follows the ownerReference.
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, patch]
# The after-training evaluation (spec.evaluation.afterTraining): one Job per training, created
# once its JobSet succeeded, then watched. Never deleted: the ownerReference does that.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create]
# The training's ConfigMap: created, or brought up to date.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# Training pods: the progress daemon lists a JobSet's pods for rank 0's IP; the pods labelled
# rosetta.dev/training are watched for the scheduler's verdict (condition Scheduled).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Kueue's Workloads: why a queued JobSet waits (phase Queued, condition Admitted), and spec.active,
# through which a user's suspend holds a queued training.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, patch]
# Warning events (invalid spec, refused change) and kopf's own.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and (include "rosetta.peering" .) .Values.watchNamespaces }}
# kopf peering per watched namespace (cluster-wide, a ClusterKopfPeering instead).
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/* Fail early, and say what to do, when a monitor's CRD is missing from the cluster. */}}
{{- define "rosetta.requireMonitoringAPI" -}}
{{- $ctx := index . 0 }}{{- $kind := index . 1 }}{{- $value := index . 2 }}
{{- if not ($ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) }}
{{- fail (printf "%s=true needs the Prometheus operator's %s CRD (monitoring.coreos.com/v1), which this cluster does not serve. Install the Prometheus operator (e.g. kube-prometheus-stack) first, or set %s=false. With `helm template`, pass --api-versions monitoring.coreos.com/v1/%s." $value $kind $value $kind) }}
{{- end }}
{{- end }}
