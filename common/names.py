"""The wire contract: every annotation, label, env, ConfigMap key and resource name, spelled once.

These strings are shared with the KAI scheduler, the reference admission webhook and binder, and the
pods already running in a cluster; changing one breaks drop-in compatibility.
"""

# Pod annotations read by admission and binder.
GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
GPU_FRACTION_NUM_DEVICES = "gpu-fraction-num-devices"
GPU_FRACTION_CONTAINER_NAME = "gpu-fraction-container-name"
# KAI v0.18.3 shorthands: the nvfractions plugin turns them into the per-container limits below.
GPU_FRACTION_LIMIT = "gpu-fraction.limit"
GPU_MEMORY_LIMIT = "gpu-memory.limit"
MPS = "mps"
SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"

# NvFractions (KAI v0.18): per-container annotations, `nvidia.com/container.<container><suffix>`.
NVFRACTIONS_ANNOTATION_PREFIX = "nvidia.com/container."
NVFRACTIONS_MEMORY_REQUEST_SUFFIX = ".gpu-memory.request"
NVFRACTIONS_MEMORY_LIMIT_SUFFIX = ".gpu-memory.limit"
NVFRACTIONS_VISIBLE_DEVICES_SUFFIX = ".gpus.devices"  # written by the binder only
GPU_COMPUTE_MODE_SUFFIX = ".gpu-compute.mode"
# Planned for KAI v0.20: the container's share of the GPU's compute, written at bind. Not read; passed through, where
# KAI v0.18.3 would refuse the pod for an unknown NvFractions key.
GPU_COMPUTE_PORTION_SUFFIX = ".gpu-compute.portion"
# KAI v0.18.3: `kai.scheduler/container.<container>.gpu-memory.portion.limit`, a fraction of the GPU's memory.
KAI_CONTAINER_ANNOTATION_PREFIX = "kai.scheduler/container."
GPU_MEMORY_PORTION_LIMIT_SUFFIX = ".gpu-memory.portion.limit"

# GPU compute sharing modes of a fractional GPU group (BindRequest selectedFractionalGpuGroups[].computeSharingMode).
COMPUTE_TIME_SLICING = "time-slicing"  # the default, also for groups written without a mode
COMPUTE_SM_SHARING = "sm-sharing"
COMPUTE_SHARING_MODES = (COMPUTE_TIME_SLICING, COMPUTE_SM_SHARING)

# GPU sharing modes (KAI v0.18 GpuSharingMode presets): which admission and binder plugins run.
SHARING_NON_MEMORY_ENFORCED = "NonMemoryEnforced"
SHARING_HAMI_CORE = "HamiCore"
SHARING_NV_FRACTIONS = "NvFractions"
SHARING_DISABLED = "Disabled"
GPU_SHARING_MODES = (SHARING_NON_MEMORY_ENFORCED, SHARING_HAMI_CORE, SHARING_NV_FRACTIONS, SHARING_DISABLED)

# Which KAI scheduler the ConfigMap modes answer to (--kai-contract): v0.18.3's request rules and annotations, or
# v0.17's for a cluster whose scheduler does not read NvFractions annotations yet.
KAI_CONTRACT_V017 = "v0.17"
KAI_CONTRACT_V018 = "v0.18"
KAI_CONTRACTS = (KAI_CONTRACT_V018, KAI_CONTRACT_V017)

# Pod annotations written by the binder.
RECEIVED_RESOURCE_TYPE = "received-resource-type"
NUMA_PLACEMENT_PREDICTED = "kai.scheduler/numa-placement-predicted"
# Not the binder's: KAI's NUMA placement exporter (v0.18.3) writes these on running pods; fracgpu leaves them be.
NUMA_PLACEMENT_OBSERVED = "kai.scheduler/numa-placement-observed"
NUMA_MEMORY_GROUPS_OBSERVED = "kai.scheduler/numa-memory-groups-observed"

# Pod labels written by the binder; the scheduler rebuilds GPU groups from them.
GPU_GROUP_LABEL = "runai-gpu-group"
MULTI_GPU_GROUP_LABEL_PREFIX = "runai-gpu-group/"
APP_LABEL = "app"

# Reservation pods.
RESERVE_FOR_GPU_INDEX = "run.ai/reserve_for_gpu_index"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
RESERVATION_CONTAINER_NAME = "resource-reservation"
RESERVATION_POD_NAME_PREFIX = "gpu-reservation"
UNKNOWN_GPU_ID = "-1"

# Resources and node labels.
NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_MIG_PREFIX = "nvidia.com/mig-"
GPU_MEMORY_NODE_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_NODE_LABEL = "nvidia.com/gpu.count"
# Countable shares (docs/decisions.md 2.17), stock-scheduler path only: what a shared-GPU pod holds, as extended
# resources the kube-scheduler, ResourceQuota and Kueue count, and what a node has of them.
MILLIGPU = "fracgpu.io/milligpu"  # thousandths of a GPU
MILLIGPU_PER_GPU = 1000
GPU_MEMORY_MIB = "fracgpu.io/gpu-memory-mib"  # MiB of GPU memory

# Env vars and ConfigMap keys.
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# Reservation pods with --fips-only (KAI v0.18.3): FIPS 140-3 only, and no hybrid ML-KEM key exchange, which a Go
# client in that mode cannot complete (kubernetes/kubernetes#133743).
GODEBUG = "GODEBUG"
GODEBUG_FIPS_ONLY = "fips140=only,tlsmlkem=0"
# The reservation program on a node without NVML (a fake-GPU node's device plugin sets it, or the operator does):
# report the device the kubelet gave the container.
FAKE_GPU_ENV = "FRACGPU_FAKE_GPU"
# The scheduler name of the release's shared settings (the fracgpu-settings ConfigMap), in every fracgpu pod's env.
SCHEDULER_NAME_ENV = "FRACGPU_SCHEDULER_NAME"
RUNAI_NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"
GPU_PORTION = "GPU_PORTION"
CUDA_DEVICE_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
# The memory limit NVIDIA's container toolkit enforces (its apply-cuda-memory-limits hook, toolkit >= v1.20.1, driver
# r615+, cgroup v2), in MiB; fracgpu's toolkitmemory plugins, off by default.
NVIDIA_GPU_MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
NVIDIA_GPU_MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
LEGACY_RUNAI_VISIBLE_DEVICES = "RUNAI-VISIBLE-DEVICES"

# ConfigMap naming pieces.
SHARED_GPU_SUFFIX = "shared-gpu"
ENV_CONFIGMAP_SUFFIX = "-evar"
VOLUME_SUFFIX = "-vol"
INIT_CONTAINER_INDEX_PREFIX = "i"
CDI_DEVICE_NAME_FORMAT = "k8s.device-plugin.nvidia.com/gpu={}"
# KAI v0.18.3 with the NRI plugin on: the fraction container's devices, in the annotation the NRI plugin reads.
CDI_CONTAINER_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/container."

# BindRequest API.
BINDREQUEST_GROUP = "scheduling.run.ai"
BINDREQUEST_VERSION = "v1alpha2"
BINDREQUEST_PLURAL = "bindrequests"
BINDREQUEST_KIND = "BindRequest"
RECEIVED_TYPE_REGULAR = "Regular"
RECEIVED_TYPE_FRACTION = "Fraction"
PHASE_PENDING = "Pending"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"
POD_BOUND_CONDITION = "PodBound"
# Label the KAI scheduler puts on the BindRequests it writes (the binder does not read it).
BINDREQUEST_SELECTED_NODE_LABEL = "selected-node"
REASON_BOUND = "Bound"
REASON_BINDING_ERROR = "BindingError"
# Ours: a running fraction pod deleted because its GPU group's reservation pod went away under it.
REASON_GPU_RESERVATION_LOST = "GPUReservationLost"

# Defaults shared by both programs.
DEFAULT_SCHEDULER_NAME = "kai-scheduler"
DEFAULT_RUNTIME_CLASS = "nvidia"
DEFAULT_NAMESPACE = "kai-scheduler"
DEFAULT_RESERVATION_NAMESPACE = "kai-resource-reservation"
DEFAULT_SCALE_ADJUST_NAMESPACE = "kai-scale-adjust"
QUEUE_LABEL = "kai.scheduler/queue"

# Volume binding (binder plugin volumebinding): Kubernetes' own names, as the scheduler and PV controller use them.
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
BOUND_BY_CONTROLLER_ANNOTATION = "pv.kubernetes.io/bound-by-controller"
BIND_COMPLETED_ANNOTATION = "pv.kubernetes.io/bind-completed"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
VOLUME_BINDING_WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"

# Dynamic resource allocation (binder plugin dynamicresources).
RESOURCE_API_GROUP = "resource.k8s.io"
RESOURCE_API_VERSION = "v1"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
RESOURCE_CLAIM_DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"

# Metric label values the reference's dashboards query: controller-runtime names a controller after its kind.
BINDREQUEST_CONTROLLER = "bindrequest"
GPU_GROUP_SYNC_QUEUE = "gpu-group-sync"  # ours: the queue of GPU-group reservation syncs

# Our own: the platforms (os/arch, comma-separated) the reservation pod image is built for, on the binder
# Deployment; `fracgpu doctor` compares them with the GPU nodes' architectures.
RESERVATION_IMAGE_PLATFORMS_ANNOTATION = "fracgpu.io/reservation-image-platforms"

# Written by the extender on a pending pod it refused once GPUs it fits are freed: an update of an unschedulable
# pod moves it back to the kube-scheduler's queue (the value is the time it was written).
EXTENDER_CAPACITY_FREED_ANNOTATION = "fracgpu.io/gpu-capacity-freed-at"

# GPU sharing through DRA (dradriver/, the webhook's DRA mode): our DRA driver's name, which is also its
# DeviceClass's name and the domain of its device attributes and capacity; the CDI kind of the per-claim specs it
# writes; NVIDIA's CDI kind, whose `<kind>=<uuid>` device the container toolkit's generated spec defines.
DRA_DRIVER_NAME = "gpu.fracgpu.io"
DRA_MEMORY_CAPACITY = "memory"
DRA_ATTRIBUTE_UUID = "uuid"
DRA_ATTRIBUTE_PRODUCT_NAME = "productName"
DRA_ATTRIBUTE_INDEX = "index"
DRA_CDI_KIND = "fracgpu.io/claim"
NVIDIA_CDI_KIND = "nvidia.com/gpu"
RESOURCE_SLICES_PATH = f"/apis/{RESOURCE_API_GROUP}/{RESOURCE_API_VERSION}/resourceslices"

# The webhook server's paths (the reference's), and ours for DRA mode: the API server calls those for the namespaces
# a registration sends there (certs register --dra-namespace-selector), whatever the server's --sharing-mode.
WEBHOOK_MUTATE_PATH = "/mutate--v1-pod"
WEBHOOK_VALIDATE_PATH = "/validate--v1-pod"
WEBHOOK_DRA_MUTATE_PATH = "/dra/mutate--v1-pod"
WEBHOOK_DRA_VALIDATE_PATH = "/dra/validate--v1-pod"
# The pods DRA mode serves by default: the stock kube-scheduler's.
DEFAULT_DRA_SCHEDULER_NAME = "default-scheduler"
