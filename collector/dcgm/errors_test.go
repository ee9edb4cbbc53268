//go:build cgo

package dcgm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuscaler/gpuscaler/collector/dcgmerr"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// TestClassify checks dcgmerr.Classify against DCGM's own codes (go-dcgm
// pkg/dcgm/const.go DCGM_ST_*) and texts (NVIDIA/DCGM dcgmlib/src/dcgm_errors.c
// errorString, errorsC here), in the two forms go-dcgm hands them over: a
// *dcgm.Error with Code (EntitiesGetLatestValues, GetSupportedDevices, GetDeviceInfo)
// and the bare text behind go-dcgm's prefix (WatchFieldsWithGroupEx "error watching
// fields: %s", connectStandaloneV2 "error connecting to nv-hostengine: %s",
// GetGPUInstanceHierarchy "error retrieving DCGM MIG hierarchy: %s").
func TestClassify(t *testing.T) {
	for name, tc := range map[string]struct {
		code     int
		want     error
		wantName string
	}{
		"CONNECTION_NOT_VALID":        {dcgm.DCGM_ST_CONNECTION_NOT_VALID, dcgmerr.ErrConnection, "DCGM_ST_CONNECTION_NOT_VALID"},
		"UNINITIALIZED":               {dcgm.DCGM_ST_UNINITIALIZED, dcgmerr.ErrConnection, "DCGM_ST_UNINITIALIZED"},
		"PROFILING_NOT_SUPPORTED":     {dcgm.DCGM_ST_PROFILING_NOT_SUPPORTED, dcgmerr.ErrProfilingRefused, "DCGM_ST_PROFILING_NOT_SUPPORTED"},
		"REQUIRES_ROOT":               {dcgm.DCGM_ST_REQUIRES_ROOT, dcgmerr.ErrProfilingRefused, "DCGM_ST_REQUIRES_ROOT"},
		"IN_USE":                      {dcgm.DCGM_ST_IN_USE, dcgmerr.ErrProfilingRefused, "DCGM_ST_IN_USE"},
		"MODULE_NOT_LOADED":           {dcgm.DCGM_ST_MODULE_NOT_LOADED, dcgmerr.ErrProfilingRefused, "DCGM_ST_MODULE_NOT_LOADED"},
		"PROFILING_LIBRARY_ERROR":     {dcgm.DCGM_ST_PROFILING_LIBRARY_ERROR, dcgmerr.ErrProfilingRefused, "DCGM_ST_PROFILING_LIBRARY_ERROR"},
		"PROFILING_MULTI_PASS":        {dcgm.DCGM_ST_PROFILING_MULTI_PASS, dcgmerr.ErrProfilingRefused, "DCGM_ST_PROFILING_MULTI_PASS"},
		"NOT_SUPPORTED":               {dcgm.DCGM_ST_NOT_SUPPORTED, dcgmerr.ErrNotSupported, "DCGM_ST_NOT_SUPPORTED"},
		"GPU_NOT_SUPPORTED":           {dcgm.DCGM_ST_GPU_NOT_SUPPORTED, dcgmerr.ErrNotSupported, "DCGM_ST_GPU_NOT_SUPPORTED"},
		"INSUFFICIENT_DRIVER_VERSION": {dcgm.DCGM_ST_INSUFFICIENT_DRIVER_VERSION, dcgmerr.ErrNotSupported, "DCGM_ST_INSUFFICIENT_DRIVER_VERSION"},
		"GPU_IS_LOST":                 {dcgm.DCGM_ST_GPU_IS_LOST, dcgmerr.ErrGPULost, "DCGM_ST_GPU_IS_LOST"},
		"RESET_REQUIRED":              {dcgm.DCGM_ST_RESET_REQUIRED, dcgmerr.ErrResetRequired, "DCGM_ST_RESET_REQUIRED"},
		"NOT_WATCHED":                 {dcgm.DCGM_ST_NOT_WATCHED, dcgmerr.ErrEntityGone, "DCGM_ST_NOT_WATCHED"},
		"INSTANCE_NOT_FOUND":          {dcgm.DCGM_ST_INSTANCE_NOT_FOUND, dcgmerr.ErrEntityGone, "DCGM_ST_INSTANCE_NOT_FOUND"},
		"COMPUTE_INSTANCE_NOT_FOUND":  {dcgm.DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND, dcgmerr.ErrEntityGone, "DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND"},
		"BADPARAM is no kind":         {dcgm.DCGM_ST_BADPARAM, nil, ""},
		"GENERIC_ERROR is no kind":    {dcgm.DCGM_ST_GENERIC_ERROR, nil, ""},
		"NO_DATA is no kind":          {dcgm.DCGM_ST_NO_DATA, nil, ""},
		"NO_PERMISSION is no kind":    {dcgm.DCGM_ST_NO_PERMISSION, nil, ""},
		"a code DCGM may add one day": {-999, nil, ""},
		"OK is no error":              {dcgm.DCGM_ST_OK, nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			text := errorsC[tc.code]
			if tc.want != nil && text == "" {
				t.Fatalf("no dcgm_errors.c text for code %d in errorsC", tc.code)
			}
			if got, gotName := dcgmerr.Classify(tc.code, true, "something else entirely"); got != tc.want || gotName != tc.wantName {
				t.Errorf("by code %d: got %v (%s), want %v (%s)", tc.code, got, gotName, tc.want, tc.wantName)
			}
			if text == "" {
				return
			}
			for _, prefix := range []string{"", "error watching fields: ", "error connecting to nv-hostengine: "} {
				if got, gotName := dcgmerr.Classify(0, false, prefix+text); got != tc.want || gotName != tc.wantName {
					t.Errorf("by text %q: got %v (%s), want %v (%s)", prefix+text, got, gotName, tc.want, tc.wantName)
				}
			}
		})
	}
}

// TestErrWrapsGoDCGMErrors runs wrapErr, goDCGM's classifier, on errors shaped as
// go-dcgm makes them: the code of a *dcgm.Error decides even against its text (go-dcgm
// utils.go Error), and a text-only error is read by its text.
func TestErrWrapsGoDCGMErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		want error
	}{
		"*dcgm.Error with GPU_IS_LOST, wrapped":   {fmt.Errorf("GPU 3: %w", &dcgm.Error{Code: dcgm.DCGM_ST_GPU_IS_LOST}), dcgmerr.ErrGPULost},
		"*dcgm.Error's code beats any text":       {fmt.Errorf("Host engine connection invalid/disconnected: %w", &dcgm.Error{Code: dcgm.DCGM_ST_IN_USE}), dcgmerr.ErrProfilingRefused},
		"WatchFieldsWithGroupEx's text":           {errors.New("error watching fields: " + errorsC[-36]), dcgmerr.ErrProfilingRefused},
		"connectStandaloneV2's text":              {errors.New("error connecting to nv-hostengine: " + errorsC[-21]), dcgmerr.ErrConnection},
		"GetGPUInstanceHierarchy's text, unknown": {errors.New("error retrieving DCGM MIG hierarchy: " + errorsC[-3]), nil},
		"no libdcgm": {errors.New("libdcgm.so.4 not found"), nil},
	} {
		t.Run(name, func(t *testing.T) {
			got := wrapErr(tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("got %v, want it to wrap the original %v", got, tc.err)
			}
			for _, kind := range []error{dcgmerr.ErrConnection, dcgmerr.ErrProfilingRefused, dcgmerr.ErrNotSupported, dcgmerr.ErrGPULost, dcgmerr.ErrResetRequired, dcgmerr.ErrEntityGone} {
				if errors.Is(got, kind) != (kind == tc.want) {
					t.Errorf("got errors.Is(%v, %v) = %t, want %t", got, kind, errors.Is(got, kind), kind == tc.want)
				}
			}
			if tc.want != nil && !strings.Contains(got.Error(), "DCGM_ST_") {
				t.Errorf("got message %q, want it to name the DCGM code", got)
			}
		})
	}
	if wrapErr(nil) != nil {
		t.Error("got an error from wrapErr(nil), want nil")
	}
}
