package scaler

import (
	"errors"
	"testing"
)

func TestTriggerCache(t *testing.T) {
	c := newTriggerCache(3)
	parses := 0
	get := func(ns string, md map[string]string) (*Trigger, error) {
		return c.get(ns, md, func() (*Trigger, error) { parses++; return ParseTrigger(ns, md, 0) })
	}
	md := map[string]string{"queue": "jobs", "queueTarget": "4", "scalerAddress": "gpuscaler:9090"}
	first, err := get("ml", md)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := get("ml", map[string]string{"scalerAddress": "gpuscaler:9090", "queueTarget": "4", "queue": "jobs"})
	if again != first || parses != 1 {
		t.Fatalf("the same metadata built anew: parsed %d times, same trigger %v", parses, again == first)
	}
	if other, _ := get("web", md); other == first || other.Namespace != "web" {
		t.Fatalf("another namespace got the cached trigger of ml")
	}
	changed, _ := get("ml", map[string]string{"queue": "jobs", "queueTarget": "8", "scalerAddress": "gpuscaler:9090"})
	if changed.QueueTarget != 8 {
		t.Fatalf("changed queueTarget read as %v, want 8", changed.QueueTarget)
	}
	bad := map[string]string{"queue": "jobs", "queueTarget": "-1"}
	if _, err := get("ml", bad); !errors.Is(err, ErrInvalidMetadata) {
		t.Fatalf("invalid metadata: %v", err)
	}
	if _, err := get("ml", bad); !errors.Is(err, ErrInvalidMetadata) {
		t.Fatalf("invalid metadata from the cache: %v", err)
	}
	// Four entries were made with room for three: the cache started afresh once.
	if c.size > 3 {
		t.Fatalf("cache holds %d entries, bound 3", c.size)
	}
	parses = 0
	if _, err := get("ml", bad); !errors.Is(err, ErrInvalidMetadata) || parses != 0 {
		t.Fatalf("the last entry was lost: parsed %d times, %v", parses, err)
	}
}

// BenchmarkTriggerCache is what a KEDA call costs to find its trigger once parsed; see
// BenchmarkParseTrigger for what it cost before.
func BenchmarkTriggerCache(b *testing.B) {
	c := newTriggerCache(defaultTriggerCacheSize)
	md := map[string]string{"scalerAddress": "gpuscaler:9090", "queue": "jobs", "queueTarget": "5",
		"podSelector": "app=svc-01,tier=gpu", "gpuUtilTarget": "60"}
	parse := func() (*Trigger, error) { return ParseTrigger("ml", md, 0) }
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.get("ml", md, parse); err != nil {
			b.Fatal(err)
		}
	}
}
