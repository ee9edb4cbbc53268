// Package xid judges NVIDIA XID errors, the driver's reports of GPU faults: which say
// the GPU itself is failing and which end one process only. Every GPU source of the
// collector judges XIDs by it, so that a device is unhealthy for the same XIDs whatever
// reads it.
package xid

// Critical reports whether XID error xid says the GPU itself is failing, as NVIDIA's
// device plugin decides by default (k8s-device-plugin internal/rm/health.go,
// getDisabledHealthCheckXids): every XID but the application errors 13 (graphics engine
// exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45 (preemptive
// cleanup), 68 (video processor exception) and 109 (context switch timeout), which end
// one process and leave the GPU healthy. 0 is no XID. Every source judges XIDs by it.
func Critical(xid uint64) bool {
	switch xid {
	case 0, 13, 31, 43, 45, 68, 109:
		return false
	}
	return true
}
