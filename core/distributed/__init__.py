"""Process groups over torch.distributed: the rank grid DP x PP x TP, one group coordinator
per axis (a gloo CPU group for metadata and objects, a device group for tensors) and the
device communicator a platform may replace (DESIGN.md section 6a)."""
