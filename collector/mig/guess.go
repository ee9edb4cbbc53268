package mig

import (
	"fmt"
	"math"
)

// GuessProfileName guesses a MIG profile's name, "<slices>g.<GB>gb", from its compute
// slices and framebuffer in MiB alone, rounded up to whole GiB: what the DCGM source
// reports when NVML could not name the profile (collector/dcgm). The device
// plugin's name rounds the slice's share of the whole GPU instead (ProfileName), so
// the guess is right for an A100 (its 3g.40gb slice has 40192 MiB) but not for an H200,
// whose slices have 16384, 33280, 71424 and 143360 MiB (read on one, 2026-11-26) for
// 1g.18gb, 2g.35gb, 3g.71gb and 7g.141gb; nor does it know the "+me" suffix.
func GuessProfileName(slices uint, fbTotalMiB float64) string {
	if slices == 0 || fbTotalMiB <= 0 {
		return ""
	}
	return fmt.Sprintf("%dg.%dgb", slices, int(math.Ceil(fbTotalMiB/1024)))
}
