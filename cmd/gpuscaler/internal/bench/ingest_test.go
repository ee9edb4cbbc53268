package bench

import (
	"testing"
	"time"
)

func TestKEDAReadsPerS(t *testing.T) {
	tests := map[string]struct {
		triggers     int
		polling, hpa time.Duration
		want         float64
	}{
		// Issue 12: "10k triggers polled at KEDA's defaults make about 2k reads/s".
		"defaults, 10,000 triggers": {10000, 30 * time.Second, 15 * time.Second, 2000},
		"defaults, 1,000 triggers":  {1000, 30 * time.Second, 15 * time.Second, 200},
		"polling every 5s":          {100, 5 * time.Second, 15 * time.Second, 100 * 2 * (1.0/5 + 1.0/15)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := kedaReadsPerS(tc.triggers, tc.polling, tc.hpa); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Errorf("got %v reads/s, want %v", got, tc.want)
			}
		})
	}
}

func TestPacerDue(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := pacer{start: start, rate: 2000}
	tests := map[string]struct {
		at   time.Time
		want int
	}{
		"before the start":   {start.Add(-time.Second), 0},
		"at the start":       {start, 0},
		"half a millisecond": {start.Add(500 * time.Microsecond), 1},
		"one second":         {start.Add(time.Second), 2000},
		"2.5 seconds":        {start.Add(2500 * time.Millisecond), 5000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := p.due(tc.at); got != tc.want {
				t.Errorf("got %d due, want %d", got, tc.want)
			}
		})
	}
}
