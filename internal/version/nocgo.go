//go:build !cgo

package version

// Cgo says the binary was built with cgo: it has the collector's DCGM and NVML sources.
const Cgo = false
