{{- /*
How this chart is built: it has no YAML of its own. Every object is read from the repository's manifests/
(files/manifests is a link to it; `helm package` stores the files themselves), and the templates below change only
what a value asks for. So the kustomize base and the chart cannot drift apart: with the default values the chart
renders exactly what kustomize renders (tests/charts/test_chart.py), and a change to manifests/ reaches both.
*/ -}}

{{- /* The manifests write fracgpu's namespace as this; it becomes the release namespace. */ -}}
{{- define "fracgpu.manifestNamespace" -}}fracgpu-system{{- end }}
{{- /* ...and the image as this (the base's image; kustomize `images:` changes it there). */ -}}
{{- define "fracgpu.manifestImage" -}}fracgpu/fracgpu:0.1.0{{- end }}

{{- /*
fracgpu.load (list $ "path/in/manifests.yaml"): the documents of one manifests file as a YAML list (read it with
fromYamlArray), moved to the release namespace as kustomize `namespace:` would move them: metadata.namespace, the
Namespace object's name and RoleBinding subjects that said fracgpu-system. Other namespaces (the reservation
namespace, kube-system) are left alone.
*/ -}}
{{- define "fracgpu.load" -}}
{{- $root := index . 0 -}}
{{- $path := printf "files/manifests/%s" (index . 1) -}}
{{- $text := $root.Files.Get $path -}}
{{- if not $text -}}
{{- fail (printf "%s is missing: files/manifests must point at the repository's manifests/" $path) -}}
{{- end -}}
{{- $from := include "fracgpu.manifestNamespace" $root -}}
{{- $to := $root.Release.Namespace -}}
{{- $documents := list -}}
{{- range $chunk := regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $doc := fromYaml $chunk -}}
{{- if hasKey $doc "Error" -}}{{- fail (printf "%s: %s" $path $doc.Error) -}}{{- end -}}
{{- if $doc -}}
{{- if eq (dig "metadata" "namespace" "" $doc) $from -}}{{- $_ := set $doc.metadata "namespace" $to -}}{{- end -}}
{{- if and (eq $doc.kind "Namespace") (eq $doc.metadata.name $from) -}}{{- $_ := set $doc.metadata "name" $to -}}{{- end -}}
{{- range $subject := $doc.subjects | default list -}}
{{- if eq ($subject.namespace | default "") $from -}}{{- $_ := set $subject "namespace" $to -}}{{- end -}}
{{- end -}}
{{- $documents = append $documents $doc -}}
{{- end -}}
{{- end -}}
{{- toYaml $documents -}}
{{- end -}}

{{- /* The fracgpu image: by digest when one is given, else by tag (default: the chart's appVersion). */ -}}
{{- define "fracgpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "fracgpu.schedulerName" -}}
{{- .Values.schedulerName | default (ternary "fracgpu-scheduler" "kai-scheduler" .Values.stockScheduler.enabled) -}}
{{- end -}}

{{- /* The settings every program reads (manifests/base/kustomization.yaml generates the same ConfigMap). */ -}}
{{- define "fracgpu.settingsData" -}}
{{- $selector := "" -}}
{{- if .Values.webhook.namespaceSelector -}}{{- $selector = toJson .Values.webhook.namespaceSelector -}}{{- end -}}
{{- $draSelector := "" -}}
{{- if .Values.dra.enabled -}}{{- $draSelector = toJson .Values.dra.namespaceSelector -}}{{- end -}}
{{- toYaml (dict "FRACGPU_SCHEDULER_NAME" (include "fracgpu.schedulerName" .)
                 "FRACGPU_WEBHOOK_FAILURE_POLICY" .Values.webhook.failurePolicy
                 "FRACGPU_COUNTABLE_GPU_SHARES" (ternary "true" "false" .Values.stockScheduler.enabled)
                 "FRACGPU_WEBHOOK_NAMESPACE_SELECTOR" $selector
                 "FRACGPU_DRA_NAMESPACE_SELECTOR" $draSelector
                 "FRACGPU_DRA_SCHEDULER_NAME" .Values.dra.schedulerName) -}}
{{- end -}}

{{- /*
The settings ConfigMap's name carries kustomize's content hash, so a changed setting gives new pods under both
tools: sha256 of Go's JSON of {data, kind, name: ""} (kustomize never finds the name it meant to hash), the first 10
hex digits, with 0 1 3 a e written g h k m t.
*/ -}}
{{- define "fracgpu.settingsName" -}}
{{- $data := include "fracgpu.settingsData" . | fromYaml -}}
{{- $hash := dict "data" $data "kind" "ConfigMap" "name" "" | toJson | sha256sum | trunc 10 -}}
{{- printf "fracgpu-settings-%s" ($hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t") -}}
{{- end -}}

{{- /*
fracgpu.pod (dict "root" $ "doc" $workload): what the values change in a Deployment's, Job's or CronJob's pod
template, in place: the fracgpu image (also as the reservation pod image flag), the settings ConfigMap's hashed
name, the stock kube-scheduler image, pull secrets, placement and priority.
*/ -}}
{{- define "fracgpu.pod" -}}
{{- $root := .root -}}
{{- $spec := .doc.spec -}}
{{- $pod := dict -}}
{{- if hasKey $spec "jobTemplate" -}}{{- $pod = $spec.jobTemplate.spec.template.spec -}}{{- else -}}{{- $pod = $spec.template.spec -}}{{- end -}}
{{- $manifestImage := include "fracgpu.manifestImage" $root -}}
{{- $image := include "fracgpu.image" $root -}}
{{- range $container := $pod.containers -}}
{{- if eq $container.image $manifestImage -}}
{{- $_ := set $container "image" $image -}}
{{- $_ := set $container "imagePullPolicy" $root.Values.image.pullPolicy -}}
{{- else if hasPrefix "registry.k8s.io/kube-scheduler:" $container.image -}}
{{- $_ := set $container "image" (include "fracgpu.stockSchedulerImage" $root) -}}
{{- end -}}
{{- $args := list -}}
{{- range $arg := $container.args | default list -}}
{{- $args = append $args (replace (printf "--resource-reservation-pod-image=%s" $manifestImage) (printf "--resource-reservation-pod-image=%s" $image) $arg) -}}
{{- end -}}
{{- if $container.args -}}{{- $_ := set $container "args" $args -}}{{- end -}}
{{- range $source := $container.envFrom | default list -}}
{{- if and $source.configMapRef (eq $source.configMapRef.name "fracgpu-settings") -}}
{{- $_ := set $source.configMapRef "name" (include "fracgpu.settingsName" $root) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $root.Values.imagePullSecrets -}}{{- $_ := set $pod "imagePullSecrets" . -}}{{- end -}}
{{- with $root.Values.nodeSelector -}}{{- $_ := set $pod "nodeSelector" . -}}{{- end -}}
{{- with $root.Values.tolerations -}}{{- $_ := set $pod "tolerations" . -}}{{- end -}}
{{- with $root.Values.affinity -}}{{- $_ := set $pod "affinity" . -}}{{- end -}}
{{- if eq .doc.metadata.name "fracgpu-admission" -}}
{{- if $root.Values.admission.priorityClassName -}}
{{- $_ := set $pod "priorityClassName" $root.Values.admission.priorityClassName -}}
{{- else -}}
{{- $_ := unset $pod "priorityClassName" -}}
{{- end -}}
{{- else if $root.Values.priorityClassName -}}
{{- $_ := set $pod "priorityClassName" $root.Values.priorityClassName -}}
{{- end -}}
{{- end -}}

{{- /* fracgpu.appendArgs (dict "doc" $deployment "args" (list ...)): arguments added to its program (first container). */ -}}
{{- define "fracgpu.appendArgs" -}}
{{- $container := index .doc.spec.template.spec.containers 0 -}}
{{- $_ := set $container "args" (concat $container.args .args) -}}
{{- end -}}

{{- /*
fracgpu.stockSchedulerImage: stockScheduler.image, or registry.k8s.io/kube-scheduler at the version of the cluster the
chart installs into (helm template: --kube-version), without a provider's suffix (v1.37.2-eks-1 -> v1.37.2).
*/ -}}
{{- define "fracgpu.stockSchedulerImage" -}}
{{- if .Values.stockScheduler.image -}}
{{- .Values.stockScheduler.image -}}
{{- else -}}
{{- $version := semver .Capabilities.KubeVersion.Version -}}
{{- printf "registry.k8s.io/kube-scheduler:v%d.%d.%d" $version.Major $version.Minor $version.Patch -}}
{{- end -}}
{{- end -}}
