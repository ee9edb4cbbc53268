package scaler

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recordedKey names a trigger as the server does, through a trigger cache.
func recordedKey(t testing.TB, c *triggerCache, ns, name string, md map[string]string) callKey {
	t.Helper()
	e := c.entry(ns, md, func() (*Trigger, error) { return ParseTrigger(ns, md, 0) })
	return callKey{entry: e, name: name}
}

func names(rows []triggerCalls) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.key.entry.namespace+"/"+r.key.name)
	}
	return out
}

func TestCallRecorderKeepsTheLastCallOfEachKind(t *testing.T) {
	clock := newFakeClock(t0)
	r := newCallRecorder(clock.Now, 10, 10*time.Minute)
	c := newTriggerCache(100)
	k := recordedKey(t, c, "ml", "llm", map[string]string{"queue": "jobs", "podSelector": "app=llm", "gpuUtilTarget": "60"})

	r.metricSpec(k, nil)
	clock.Advance(time.Second)
	r.isActive(k, true, nil)
	r.metric(k, MetricQueueBacklog, 3, nil)
	clock.Advance(time.Second)
	unavailable := status.Error(codes.Unavailable, "no fresh report")
	r.metric(k, MetricGPUUtil, 0, unavailable)
	r.metric(k, MetricQueueBacklog, 5, nil)
	r.metric(k, "no-such-metric", 0, status.Error(codes.NotFound, "unknown"))
	r.metric(k, "another-one", 0, status.Error(codes.NotFound, "unknown"))
	r.metric(k, "a-fifth", 0, status.Error(codes.NotFound, "unknown")) // the last slot takes it

	rows, now := r.snapshot()
	if len(rows) != 1 || !now.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("snapshot = %d rows at %v, want 1 at %v", len(rows), now, t0.Add(2*time.Second))
	}
	got := rows[0]
	if !got.spec.at.Equal(t0) || got.spec.err != nil {
		t.Errorf("GetMetricSpec recorded %+v, want at %v without error", got.spec, t0)
	}
	if !got.isActive.active || !got.isActive.at.Equal(t0.Add(time.Second)) {
		t.Errorf("IsActive recorded %+v, want true at t0+1s", got.isActive)
	}
	want := []struct {
		name  string
		value float64
		code  codes.Code
	}{{MetricQueueBacklog, 5, codes.OK}, {MetricGPUUtil, 0, codes.Unavailable}, {"no-such-metric", 0, codes.NotFound}, {"a-fifth", 0, codes.NotFound}}
	for i, w := range want {
		m := got.metrics[i]
		if m.name != w.name || m.value != w.value || status.Code(m.err) != w.code {
			t.Errorf("metric slot %d = %q %v %v, want %q %v %v", i, m.name, m.value, status.Code(m.err), w.name, w.value, w.code)
		}
	}
	if !got.last.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("last call at %v, want t0+2s", got.last)
	}
}

func TestCallRecorderEvictsTheLeastRecentlyCalled(t *testing.T) {
	clock := newFakeClock(t0)
	r := newCallRecorder(clock.Now, 3, 10*time.Minute)
	c := newTriggerCache(100)
	keys := make([]callKey, 4)
	for i := range keys {
		keys[i] = recordedKey(t, c, "ml", fmt.Sprintf("so-%d", i), map[string]string{"queue": "jobs"})
	}
	for _, k := range keys[:3] {
		clock.Advance(time.Second)
		r.isActive(k, false, nil)
	}
	clock.Advance(time.Second)
	r.isActive(keys[0], false, nil) // so-1 is now the least recently called
	clock.Advance(time.Second)
	r.isActive(keys[3], false, nil)
	rows, _ := r.snapshot()
	if got, want := fmt.Sprint(names(rows)), "[ml/so-3 ml/so-0 ml/so-2]"; got != want {
		t.Fatalf("rows %s, want %s: so-1 evicted, newest first", got, want)
	}
}

func TestCallRecorderDropsIdleTriggersButNotOpenStreams(t *testing.T) {
	clock := newFakeClock(t0)
	r := newCallRecorder(clock.Now, 10, 10*time.Minute)
	c := newTriggerCache(100)
	polled := recordedKey(t, c, "ml", "polled", map[string]string{"queue": "a"})
	streamed := recordedKey(t, c, "ml", "streamed", map[string]string{"queue": "b"})
	gone := recordedKey(t, c, "ml", "gone", map[string]string{"queue": "c"})
	r.isActive(gone, false, nil)
	r.streamOpened(streamed, false)
	r.isActive(polled, false, nil)
	clock.Advance(9 * time.Minute)
	r.isActive(polled, true, nil)
	clock.Advance(2 * time.Minute)
	rows, _ := r.snapshot()
	if got, want := fmt.Sprint(names(rows)), "[ml/polled ml/streamed]"; got != want {
		t.Fatalf("rows %s, want %s: gone idle 11m dropped, streamed kept by its open stream", got, want)
	}
	if rows[1].streamsOpen != 1 {
		t.Fatalf("streamed has %d streams open, want 1", rows[1].streamsOpen)
	}
	r.streamEnded(streamed, true, nil)
	clock.Advance(10*time.Minute + time.Second)
	r.isActive(polled, true, nil)
	rows, _ = r.snapshot()
	if got, want := fmt.Sprint(names(rows)), "[ml/polled]"; got != want {
		t.Fatalf("rows %s, want %s: streamed dropped 10m after its stream ended", got, want)
	}
	if _, ok := r.byID(rows[0].id); !ok {
		t.Fatalf("byID(%d) did not find polled", rows[0].id)
	}
}

func TestCallRecorderStreams(t *testing.T) {
	clock := newFakeClock(t0)
	r := newCallRecorder(clock.Now, 10, 10*time.Minute)
	k := recordedKey(t, newTriggerCache(100), "ml", "llm", map[string]string{"queue": "jobs"})
	r.streamOpened(k, false)
	r.streamOpened(k, false)
	clock.Advance(time.Second)
	r.streamSent(k)
	clock.Advance(time.Second)
	r.streamEnded(k, true, status.Error(codes.Canceled, "context canceled"))
	rows, _ := r.snapshot()
	got := rows[0]
	if got.streamsOpen != 1 || !got.opened.Equal(t0) || !got.sent.active || !got.sent.at.Equal(t0.Add(time.Second)) ||
		status.Code(got.ended.err) != codes.Canceled {
		t.Fatalf("stream row %+v: want 1 open, opened t0, sent true at t0+1s, ended Canceled", got)
	}
	// A stream refused before it opened counts no open stream down.
	r.streamEnded(k, false, status.Error(codes.ResourceExhausted, "limit"))
	r.streamEnded(k, true, nil)
	r.streamEnded(k, true, nil) // as if the row had been evicted and made anew meanwhile
	if rows, _ := r.snapshot(); rows[0].streamsOpen != 0 {
		t.Fatalf("%d streams open, want 0", rows[0].streamsOpen)
	}
}

func TestCallRecorderNilAndZeroKeyRecordNothing(t *testing.T) {
	var nilRecorder *callRecorder
	nilRecorder.isActive(callKey{}, true, nil)
	if rows, _ := nilRecorder.snapshot(); rows != nil {
		t.Fatalf("nil recorder snapshot %v", rows)
	}
	r := newCallRecorder(time.Now, 10, time.Minute)
	r.isActive(callKey{name: "no entry"}, true, nil)
	r.metric(callKey{}, MetricQueueBacklog, 1, nil)
	r.streamOpened(callKey{}, true)
	if rows, _ := r.snapshot(); len(rows) != 0 {
		t.Fatalf("zero keys recorded %d rows, want 0", len(rows))
	}
}

// BenchmarkCallRecorder is what recording a GetMetrics call adds to it once the trigger
// has its row: see BenchmarkGetMetrics for the whole call.
func BenchmarkCallRecorder(b *testing.B) {
	r := newCallRecorder(time.Now, defaultCallRows, defaultCallIdleAfter)
	c := newTriggerCache(defaultTriggerCacheSize)
	keys := make([]callKey, defaultCallRows)
	for i := range keys {
		keys[i] = recordedKey(b, c, "ml", fmt.Sprintf("so-%d", i), map[string]string{"queue": fmt.Sprintf("q-%d", i)})
		r.metric(keys[i], MetricQueueBacklog, 1, nil)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.metric(keys[i%len(keys)], MetricQueueBacklog, 2, nil)
		i++
	}
}
