//go:build cgo

// Package dcgmerr tells what kind of failure a DCGM error is, by DCGM's return code or by
// its errorString text, so that the DCGM source decides with errors.Is and never reads
// DCGM's codes or texts itself. It is a package of its own so that its fuzz target runs
// in a small test binary (Go's fuzzer scans the coverage of every package a test binary
// links; in the collectors package, where the DCGM source then was, it ran ten times slower).
package dcgmerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// The kinds of DCGM failure the DCGM source acts on. goDCGM wraps every go-dcgm error
// in one of them (Classify) when it recognises it, so the source decides with
// errors.Is and never reads DCGM's codes or texts itself.
var (
	// ErrConnection: the host engine is gone (restarted, upgraded, killed). The
	// source shuts DCGM down and connects again with back-off.
	ErrConnection = errors.New("DCGM host engine connection lost")
	// ErrProfilingRefused: the profiling module will not watch the profiling fields
	// (GPU without profiling support, non-root host engine, another profiler holding
	// the counters, module not loaded). The base fields are still read.
	ErrProfilingRefused = errors.New("DCGM profiling refused")
	// ErrNotSupported: the feature or GPU is not supported (by the GPU, the driver
	// or this DCGM build).
	ErrNotSupported = errors.New("not supported by DCGM")
	// ErrGPULost: the GPU has fallen off the bus or stopped answering.
	ErrGPULost = errors.New("GPU is lost")
	// ErrResetRequired: the GPU needs a reset before it can be used again.
	ErrResetRequired = errors.New("GPU requires reset")
	// ErrEntityGone: the GPU, GPU instance or compute instance no longer exists (a
	// MIG re-layout), or DCGM no longer watches it: the source rediscovers.
	ErrEntityGone = errors.New("DCGM entity gone")
)

// dcgmErrorClass is one row of what Classify knows: a DCGM return code, the text
// DCGM's errorString gives it (NVIDIA/DCGM dcgmlib/src/dcgm_errors.c, errorString), the
// code's name in DCGM (dcgm_structs.h, go-dcgm pkg/dcgm/const.go) and its kind.
type dcgmErrorClass struct {
	code int
	name string
	text string
	kind error
}

// dcgmErrorClasses lists the codes the source treats apart. The texts are DCGM 4.6's
// (NVIDIA/DCGM dcgmlib/src/dcgm_errors.c); go-dcgm puts them in its errors, after its own
// prefix ("error watching fields: …").
var dcgmErrorClasses = []dcgmErrorClass{
	// go-dcgm itself treats these two as "DCGM state gone" (pkg/dcgm/policy.go,
	// unregisterErrorClearsLocalState).
	{dcgm.DCGM_ST_CONNECTION_NOT_VALID, "DCGM_ST_CONNECTION_NOT_VALID", "Host engine connection invalid/disconnected", ErrConnection},
	{dcgm.DCGM_ST_UNINITIALIZED, "DCGM_ST_UNINITIALIZED", "Object is in an undefined state", ErrConnection},

	{dcgm.DCGM_ST_PROFILING_NOT_SUPPORTED, "DCGM_ST_PROFILING_NOT_SUPPORTED", "Profiling is not supported for this group of GPUs or GPU", ErrProfilingRefused},
	{dcgm.DCGM_ST_REQUIRES_ROOT, "DCGM_ST_REQUIRES_ROOT", "Host engine is running as non-root", ErrProfilingRefused},
	{dcgm.DCGM_ST_IN_USE, "DCGM_ST_IN_USE", "The requested operation could not be completed because the affected resource is in use", ErrProfilingRefused},
	{dcgm.DCGM_ST_MODULE_NOT_LOADED, "DCGM_ST_MODULE_NOT_LOADED", "This request is serviced by a module of DCGM that is not currently loaded", ErrProfilingRefused},
	{dcgm.DCGM_ST_PROFILING_LIBRARY_ERROR, "DCGM_ST_PROFILING_LIBRARY_ERROR", "The third-party Profiling module returned an unrecoverable error", ErrProfilingRefused},
	{dcgm.DCGM_ST_PROFILING_MULTI_PASS, "DCGM_ST_PROFILING_MULTI_PASS", "The requested profiling metrics cannot be collected in a single pass", ErrProfilingRefused},

	{dcgm.DCGM_ST_NOT_SUPPORTED, "DCGM_ST_NOT_SUPPORTED", "Feature not supported", ErrNotSupported},
	{dcgm.DCGM_ST_GPU_NOT_SUPPORTED, "DCGM_ST_GPU_NOT_SUPPORTED", "This GPU is not supported by DCGM", ErrNotSupported},
	{dcgm.DCGM_ST_INSUFFICIENT_DRIVER_VERSION, "DCGM_ST_INSUFFICIENT_DRIVER_VERSION", "The installed driver version is insufficient for this API", ErrNotSupported},

	{dcgm.DCGM_ST_GPU_IS_LOST, "DCGM_ST_GPU_IS_LOST", "GPU is lost", ErrGPULost},
	{dcgm.DCGM_ST_RESET_REQUIRED, "DCGM_ST_RESET_REQUIRED", "GPU requires reset", ErrResetRequired},

	// A value of an entity DCGM no longer watches (DcgmCacheManager.cpp,
	// PrecheckWatchInfoForSamples), or a MIG instance that no longer exists (its
	// MigManager lookups in GetGpuId).
	{dcgm.DCGM_ST_NOT_WATCHED, "DCGM_ST_NOT_WATCHED", "Field is not being watched", ErrEntityGone},
	{dcgm.DCGM_ST_INSTANCE_NOT_FOUND, "DCGM_ST_INSTANCE_NOT_FOUND", "The specified GPU instance does not exist", ErrEntityGone},
	{dcgm.DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND, "DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND", "The specified GPU compute instance does not exist", ErrEntityGone},
}

// Classify says what kind of failure a DCGM error is: by its return code when
// known (go-dcgm returns a *dcgm.Error with Code from some functions), else by DCGM's
// errorString text inside its message (most go-dcgm functions wrap the text with
// fmt.Errorf("…: %s") and drop the code). It returns the matching sentinel and the
// code's name, or nil and "" for anything else. A known code decides, whatever the text.
//
// No DCGM text contains another of dcgmErrorClasses' texts, so a real message matches
// one row at most; a message holding several (a go-dcgm prefix quoting another error)
// takes the first row's, and a lost connection comes first: reconnecting is what
// matters most.
func Classify(code int, hasCode bool, text string) (kind error, name string) {
	for _, c := range dcgmErrorClasses {
		if hasCode && c.code == code || !hasCode && strings.Contains(text, c.text) {
			return c.kind, c.name
		}
	}
	return nil, ""
}

// StatusName names a DCGM return code as DCGM does ("DCGM_ST_GPU_IS_LOST"), or
// "DCGM return <n>" for a code the source does not treat apart.
func StatusName(code int) string {
	if _, name := Classify(code, true, ""); name != "" {
		return name
	}
	return fmt.Sprintf("DCGM return %d", code)
}

// Wrap wraps err in the sentinel Classify finds for it, keeping err's own
// message and chain; err is returned as it is when it is nil or of no known kind.
func Wrap(err error, code int, hasCode bool) error {
	if err == nil {
		return nil
	}
	kind, name := Classify(code, hasCode, err.Error())
	if kind == nil {
		return err
	}
	return &dcgmError{kind: kind, name: name, err: err}
}

// dcgmError is a go-dcgm error with the kind Classify gave it. errors.Is finds both
// the kind and anything err wraps.
type dcgmError struct {
	kind error
	name string // the DCGM code's name, "DCGM_ST_IN_USE"
	err  error
}

func (e *dcgmError) Error() string   { return e.err.Error() + " (" + e.name + ")" }
func (e *dcgmError) Unwrap() []error { return []error{e.kind, e.err} }

// Name returns the DCGM code name of a classified error ("DCGM_ST_IN_USE"), or
// "" when err was not classified.
func Name(err error) string {
	var de *dcgmError
	if errors.As(err, &de) {
		return de.name
	}
	return ""
}
