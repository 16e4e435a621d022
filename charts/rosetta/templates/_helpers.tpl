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

{{/* Labels of every object but the component, which each object states once (a key given twice
     is a duplicate that strict YAML parsers refuse). */}}
{{- define "rosetta.commonLabels" -}}
helm.sh/chart: {{ include "rosetta.chart" . }}
app.kubernetes.io/name: {{ include "rosetta.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rosetta
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "rosetta.labels" -}}
{{ include "rosetta.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The chart's labels plus a user's extra ones, as one mapping: a user's label of the same key is
     dropped rather than written twice, and cannot move the operator's pods out of their selector.
     Arguments: (list CONTEXT EXTRA-LABELS). */}}
{{- define "rosetta.labelsWith" -}}
{{- $ctx := index . 0 }}
{{- toYaml (merge (include "rosetta.labels" $ctx | fromYaml) (index . 1 | default dict)) }}
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

{{/* Fail, naming the value and what to set, when an image reference could not be pulled as
     written: a placeholder of values-eks.yaml or values-gke.yaml left in, or not a repository a
     container runtime accepts. Either would otherwise surface only later, as InvalidImageName on the
     operator's pod or, for the trainer image, on the pods of every training without spec.image.
     Arguments: (list VALUE REPOSITORY WHAT-TO-SET EXAMPLE). */}}
{{- define "rosetta.checkRepository" -}}
{{- $value := index . 0 }}{{- $repository := index . 1 }}{{- $what := index . 2 }}{{- $example := index . 3 }}
{{- $placeholders := list }}
{{- range regexSplit "[^A-Za-z0-9]+" $repository -1 }}
{{- if has . (list "ACCOUNT" "REGION" "PROJECT" "REPO") }}{{ $placeholders = append $placeholders . | uniq }}{{ end }}
{{- end }}
{{- if $placeholders }}
{{- $are := ternary "is a placeholder" "are placeholders" (eq (len $placeholders) 1) }}
{{- fail (printf "%s is %q: %s %s of values-eks.yaml/values-gke.yaml, not part of an image name. Set %s to %s, e.g. --set %s=%s (build_and_push.sh prints the names it pushed; the helm install commands of docs/eks.md and docs/gke.md set both images)." $value $repository (join ", " $placeholders) $are $value $what $value $example) }}
{{- end }}
{{- /* Docker's reference grammar, lowercase throughout: an optional registry host[:port], then
       path components of lowercase letters and digits joined by ., _, __ or dashes. */}}
{{- $host := `[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*(?::[0-9]+)?` }}
{{- $component := `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*` }}
{{- if not (regexMatch (printf "^(?:%s/)?%s(?:/%s)*$" $host $component $component) $repository) }}
{{- $form := ternary ", without a tag or digest (the tag is a value of its own)" "" (hasSuffix ".repository" $value) }}
{{- fail (printf "%s is %q, which is not an image repository a container runtime accepts: lowercase letters and digits, path components joined by /, an optional registry host[:port] first%s. Set %s to %s, e.g. --set %s=%s." $value $repository $form $value $what $value $example) }}
{{- end }}
{{- end }}

{{/* A tag as Docker reads one. Arguments: (list VALUE TAG EXAMPLE). */}}
{{- define "rosetta.checkTag" -}}
{{- $value := index . 0 }}{{- $tag := index . 1 }}
{{- if not (regexMatch `^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$` $tag) }}
{{- fail (printf "%s has the tag %q, which is not an image tag: up to 128 letters, digits, _, . and -, not starting with . or -. Set it to the tag you pushed, e.g. %s." $value $tag (index . 2)) }}
{{- end }}
{{- end }}

{{/* Every image reference of the values, checked before anything is rendered from them. */}}
{{- define "rosetta.checkImages" -}}
{{- include "rosetta.checkRepository" (list "image.repository" .Values.image.repository "the operator image you pushed" "ghcr.io/my-org/rosetta-operator") }}
{{- with .Values.image.tag }}{{ include "rosetta.checkTag" (list "image.tag" . $.Chart.AppVersion) }}{{ end }}
{{- include "rosetta.checkRepository" (list "trainer.image.repository" .Values.trainer.image.repository "the trainer image you pushed" "ghcr.io/my-org/rosetta-trainer") }}
{{- with .Values.trainer.image.tag }}{{ include "rosetta.checkTag" (list "trainer.image.tag" . $.Chart.AppVersion) }}{{ end }}
{{- with .Values.helmTest.image }}
{{- $reference := . }}
{{- $digest := "" }}
{{- if contains "@" $reference }}
{{- $digest = regexReplaceAll "^[^@]*@" $reference "" }}
{{- $reference = regexReplaceAll "@.*$" $reference "" }}
{{- end }}
{{- $tag := "" }}
{{- if regexMatch ":[^/]*$" $reference }}
{{- $tag = regexReplaceAll "^.*:" $reference "" }}
{{- $reference = regexReplaceAll ":[^:/]*$" $reference "" }}
{{- end }}
{{- include "rosetta.checkRepository" (list "helmTest.image" $reference "an image with python3 that the nodes can pull" "python:3.11-slim") }}
{{- with $tag }}{{ include "rosetta.checkTag" (list "helmTest.image" . "python:3.11-slim") }}{{ end }}
{{- if and $digest (not (regexMatch `^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-f]{32,}$` $digest)) }}
{{- fail (printf "helmTest.image has the digest %q, which is not one: ALGORITHM:HEX, e.g. sha256: and 64 hex digits." $digest) }}
{{- end }}
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

{{/* The admin policy file (`rosetta operator --policy`): the `policy` values as they are, defaults
     included, so that the operator enforces what values.yaml says. Helm drops a key whose value a
     user sets to null, and the operator would then apply its own default in its place: the limits
     that null lifts are written back as null. */}}
{{- define "rosetta.policy" -}}
{{- $policy := deepCopy .Values.policy }}
{{- range list "maxEfaPerNode" "maxNodes" "maxGpusPerNode" "maxGpusPerTraining" "maxCpuPerPod" "maxMemoryPerPod" "maxShmSize" "maxCpuPerTraining" "maxMemoryPerTraining" }}
{{- if not (hasKey $policy .) }}{{ $_ := set $policy . nil }}{{ end }}
{{- end }}
{{- toYaml $policy }}
{{- end }}

{{/* The namespaces the operator watches, as a JSON list (read with fromJsonArray): none when it
     watches every namespace (clusterWide), else watchNamespaces, else the release's own. */}}
{{- define "rosetta.watchedNamespaces" -}}
{{- if and .Values.clusterWide .Values.watchNamespaces }}
{{- fail (printf "clusterWide=true watches every namespace, and watchNamespaces lists %s: set one or the other (watchNamespaces without clusterWide gives a Role in each listed namespace and no cluster-wide write)." (join ", " .Values.watchNamespaces)) }}
{{- end }}
{{- if .Values.clusterWide }}[]
{{- else }}{{ toJson (.Values.watchNamespaces | default (list .Release.Namespace) | uniq) }}
{{- end }}
{{- end }}

{{/* What the operator does inside a watched namespace (rosetta_operator/handlers/, plus kopf itself). */}}
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
# once its JobSet succeeded, then watched. Never deleted: the ownerReference does that. Patched
# only to end a stalled gang's Job (activeDeadlineSeconds; spec.faultTolerance.stallAction:
# restart): a patch can end a Job, not change what a running one runs (its pod template is fixed).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch]
# The training's ConfigMap: created, or brought up to date.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# Training pods: the progress daemon lists a JobSet's pods for rank 0's IP; the pods labelled
# rosetta.dev/training are watched for the scheduler's verdict (condition Scheduled) and why they
# failed (status.attempts). patch: with the pre-flight check on, the operator lifts the gate of a
# gang pod, adding node anti-affinity for the nodes that failed it (status.excludedNodes).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# Kueue's Workloads: why a queued JobSet waits (phase Queued, condition Admitted), and spec.active,
# through which a user's suspend holds a queued training.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, patch]
# Warning events (invalid spec, refused change) and kopf's own.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and (include "rosetta.peering" .) (not .Values.clusterWide) }}
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
