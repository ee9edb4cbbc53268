package mig

import "testing"

func TestGuessProfileName(t *testing.T) {
	for _, tc := range []struct {
		slices uint
		mib    float64
		want   string
	}{
		// An A100 40GB's profiles, with the memory sizes go-nvml's dgxa100 mock gives them.
		{1, 4864, "1g.5gb"}, {1, 9856, "1g.10gb"}, {2, 9856, "2g.10gb"}, {3, 19968, "3g.20gb"},
		{4, 19968, "4g.20gb"}, {7, 40192, "7g.40gb"},
		{1, 0, ""}, {0, 1024, ""},
	} {
		if got := GuessProfileName(tc.slices, tc.mib); got != tc.want {
			t.Errorf("GuessProfileName(%d, %v) = %q, want %q", tc.slices, tc.mib, got, tc.want)
		}
	}
}
