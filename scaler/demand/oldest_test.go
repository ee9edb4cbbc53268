package demand

import (
	"testing"
	"time"
)

// TestWaitsByHand: reports a second apart, items leaving in the order they came.
func TestWaitsByHand(t *testing.T) {
	var w Waits
	s := time.Second
	steps := []struct {
		at               time.Duration
		arrived, waiting uint64
		want             time.Duration
	}{
		{0, 0, 0, 0},
		// Four arrive between 0 and 1 s: taken as spread evenly, the first at 1/8 s.
		{1 * s, 4, 4, 1*s - s/8},
		{2 * s, 4, 4, 2*s - s/8},
		// Two of them start: the oldest waiting is the third, at 5/8 s.
		{3 * s, 4, 2, 3*s - 5*s/8},
		// More arrive: the oldest is still the third.
		{4 * s, 10, 8, 4*s - 5*s/8},
		// The four first have left: the oldest is the fifth, the first of six between
		// 3 and 4 s, at 3 s + 1/12 s.
		{5 * s, 10, 6, 5*s - 3*s - s/12},
		{6 * s, 10, 0, 0},
		// One arrives: taken to have come half-way between the reports.
		{7 * s, 11, 1, s / 2},
		{9 * s, 11, 1, 2*s + s/2},
	}
	for _, st := range steps {
		if got := w.Oldest(st.at, st.arrived, st.waiting); got != st.want {
			t.Errorf("at %s, %d arrived, %d waiting: oldest waited %s, want %s", st.at, st.arrived, st.waiting, got, st.want)
		}
	}
}

// TestWaitsKeepsAQuarterHour: past waitsKept reports that saw arrivals, an item still
// waiting is told as waiting since the earliest report kept, at least; reports with no
// arrival keep nothing, so a quiet queue's oldest item is known however long it waits.
func TestWaitsKeepsAQuarterHour(t *testing.T) {
	var w Waits
	w.Oldest(0, 0, 0)
	w.Oldest(time.Second, 1, 1) // the item that will wait
	for i := range 3 * waitsKept {
		if got, want := w.Oldest(time.Duration(2+i)*time.Second, 1, 1), time.Duration(1+i)*time.Second+time.Second/2; got != want {
			t.Fatalf("after %d reports with no arrival: %s, want %s", i+1, got, want)
		}
	}
	at := time.Duration(2+3*waitsKept) * time.Second
	for i := range uint64(2 * waitsKept) {
		at += time.Second
		w.Oldest(at, 2+i, 2+i)
	}
	if got, want := w.Oldest(at, 1+2*waitsKept, 2*waitsKept+1), time.Duration(waitsKept)*time.Second; got != want {
		t.Errorf("the oldest item's reports overwritten: %s, want since the earliest kept, %s", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { at += time.Second; w.Oldest(at, 5*waitsKept, 3) }); n != 0 {
		t.Errorf("Oldest allocates %g times a call", n)
	}
}

// TestWaitsWithinAReportInterval: items arriving unevenly and leaving in order, reports
// every second: the wait told is within a report interval of the oldest's true wait.
func TestWaitsWithinAReportInterval(t *testing.T) {
	var (
		w       Waits
		arrived []time.Duration // every arrival's time
		left    int             // how many have left the waiting
	)
	now := time.Duration(0)
	for step := range 600 {
		next := now + time.Second
		for i := range (step * 7) % 5 {
			arrived = append(arrived, now+time.Duration(i+1)*time.Second/6)
		}
		now = next
		left = min(len(arrived), left+(step*3)%4)
		waiting := uint64(len(arrived) - left)
		got := w.Oldest(now, uint64(len(arrived)), waiting)
		if waiting == 0 {
			if got != 0 {
				t.Fatalf("at %s none waits: %s", now, got)
			}
			continue
		}
		if truth := now - arrived[left]; got < truth-time.Second || got > truth+time.Second {
			t.Fatalf("at %s the oldest has waited %s: told %s", now, truth, got)
		}
	}
}
