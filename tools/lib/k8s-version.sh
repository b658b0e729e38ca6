# Sourced by tools/*.sh: which Kubernetes version the test bed builds and runs (tools/k8s/versions.tsv).
#   k8s_version_select   sets K8S_VERSION, K8S_MAJOR, K8S_MINOR, K8S_BUILD_DATE and ETCD_VERSION from
#                        FRACGPU_K8S_VERSION (or the default row); returns 2, naming the supported ones, for
#                        a version the table does not list.
K8S_VERSIONS_TABLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/k8s/versions.tsv"

k8s_version_select() {
    local wanted="${FRACGPU_K8S_VERSION:-}" version date etcd role supported=()
    while IFS=$'\t' read -r version date etcd role; do
        [[ -z "$version" || "$version" == \#* ]] && continue
        supported+=("$version")
        if [[ ( -z "$wanted" && "$role" == "default" ) || "$version" == "$wanted" || "$version" == "v$wanted" ]]; then
            K8S_VERSION="$version"
            K8S_BUILD_DATE="$date"
            ETCD_VERSION="$etcd"
        fi
    done <"$K8S_VERSIONS_TABLE"
    if [[ -z "${K8S_VERSION:-}" ]]; then
        echo "FRACGPU_K8S_VERSION=$wanted is not a supported Kubernetes version; expected one of: ${supported[*]} (tools/k8s/versions.tsv)" >&2
        return 2
    fi
    K8S_MAJOR="$(cut -d. -f1 <<<"${K8S_VERSION#v}")"
    K8S_MINOR="$(cut -d. -f2 <<<"$K8S_VERSION")"
    export K8S_VERSION K8S_MAJOR K8S_MINOR K8S_BUILD_DATE ETCD_VERSION
}
