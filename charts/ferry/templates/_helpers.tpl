{{/* Labels of the operator's objects; its pods' selector is distinct from the service's. */}}
{{- define "ferry.operatorLabels" -}}
app.kubernetes.io/name: ferry-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ferry.operatorSelector" -}}
app.kubernetes.io/name: ferry-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferry.operatorImage" -}}
{{- $i := mergeOverwrite (deepCopy .Values.image) .Values.operator.image -}}
{{ $i.repository }}:{{ $i.tag }}
{{- end }}

{{/*
The operator's permissions on namespaced resources (the same as deploy/operator/10-rbac.yaml,
which tests/tests/service_deploy.rs checks): in a ClusterRole when it watches every
namespace, else in a Role in each watched namespace.
*/}}
{{- define "ferry.operatorNamespacedRules" -}}
- apiGroups: [ferry.dev]
  resources: [transfers]
  verbs: [get, list, watch, patch, create, delete]
- apiGroups: [ferry.dev]
  resources: [checksums]
  verbs: [list, watch, patch]
- apiGroups: [ferry.dev]
  resources: [transfers/status, checksums/status]
  verbs: [patch]
- apiGroups: [ferry.dev]
  resources: [volumeimagesources]
  verbs: [get, list, watch]
- apiGroups: [ferry.dev]
  resources: [ferrybackups]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [ferry.dev]
  resources: [ferryrestores]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [ferry.dev]
  resources: [backuprepositories]
  verbs: [get, list, watch]
- apiGroups: [ferry.dev]
  resources: [backupschedules]
  verbs: [get, list, watch]
- apiGroups: [ferry.dev]
  resources: [ferrybackups/status, backuprepositories/status, backupschedules/status, ferryrestores/status]
  verbs: [patch]
- apiGroups: [ferry.dev]
  resources: [goldenimages]
  verbs: [get, list, watch]
- apiGroups: [ferry.dev]
  resources: [goldenimages/status]
  verbs: [patch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots]
  verbs: [get, create, delete]
# A BackupSchedule's volumeGroup: its group snapshots and their members.
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots]
  verbs: [list, patch]
- apiGroups: [groupsnapshot.storage.k8s.io]
  resources: [volumegroupsnapshots]
  verbs: [get, list, create, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [pods/exec]
  verbs: [get, create]
- apiGroups: [kubevirt.io]
  resources: [virtualmachineinstances]
  verbs: [get]
- apiGroups: [subresources.kubevirt.io]
  resources: [virtualmachineinstances/freeze, virtualmachineinstances/unfreeze]
  verbs: [update]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [list]
{{- end }}

{{/* Cluster-scoped resources the populator reads or rebinds: always a ClusterRole. */}}
{{- define "ferry.operatorClusterRules" -}}
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get, list, patch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
# Storage classes: which is the default, watched with the StorageClassProfiles (the
# modes and file-system overhead of the claims ferry makes).
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [get, list, watch]
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshotclasses]
  verbs: [list]
# copyMethod Snapshot with changed-block tracking: a VolumeSnapshot's content (CSI
# handle, driver) and the driver's SnapshotMetadataService.
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshotcontents]
  verbs: [get]
# A BackupSchedule's volumeGroup: a group snapshot's content (its handle pairs), set to
# Retain before its members are handed out, deleted with the group snapshot.
- apiGroups: [groupsnapshot.storage.k8s.io]
  resources: [volumegroupsnapshotcontents]
  verbs: [get, patch, delete]
- apiGroups: [cbt.storage.k8s.io]
  resources: [snapshotmetadataservices]
  verbs: [get]
- apiGroups: [ferry.dev]
  resources: [storageclassprofiles]
  verbs: [list, watch]
- apiGroups: [storage.k8s.io]
  resources: [volumeattachments]
  verbs: [list]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list]
# A Transfer that fans out places its mover groups by the nodes' CSI attach limits.
- apiGroups: [storage.k8s.io]
  resources: [csinodes]
  verbs: [list]
# A clone from another namespace: may the Transfer's creator read the source claim?
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
# The admission webhook: its caBundle set at start.
- apiGroups: [admissionregistration.k8s.io]
  resources: [mutatingwebhookconfigurations]
  resourceNames: [{{ .Release.Name }}-operator]
  verbs: [get, update]
{{- end }}
