// The sandbox ("pause") program of the local cluster's real node. No registry is reachable from
// the machines this project runs on, so the image containerd needs for every pod is built here.
module pmem-csi-pulumi/tools/pause

go 1.26.0
