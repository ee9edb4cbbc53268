package xid

import "testing"

// TestCritical follows NVIDIA's device plugin (k8s-device-plugin
// internal/rm/health.go, getDisabledHealthCheckXids): XIDs 13, 31, 43, 45, 68 and 109
// are application errors that leave the GPU healthy; any other XidCriticalError marks
// the device unhealthy.
func TestCritical(t *testing.T) {
	if Critical(0) {
		t.Error("XID 0 (none): got critical")
	}
	for _, xid := range []uint64{13, 31, 43, 45, 68, 109} {
		if Critical(xid) {
			t.Errorf("XID %d: got critical, want an application error", xid)
		}
	}
	// 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high
	// single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP.
	for _, xid := range []uint64{8, 32, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} {
		if !Critical(xid) {
			t.Errorf("XID %d: got an application error, want critical", xid)
		}
	}
}
