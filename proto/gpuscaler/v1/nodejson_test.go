package gpuscalerv1

import "testing"

// FuzzNodeReportFromJSON feeds arbitrary text to the parser behind 'publish node --file':
// it must never panic, and whatever it accepts must validate, have a subject and an
// observed_at.
func FuzzNodeReportFromJSON(f *testing.F) {
	f.Add(`{"node":"gpu-1","gpus":[{"uuid":"GPU-1","gpuUtil":50,"pod":{"namespace":"ml","name":"p"}}]}`)
	f.Add(`{"node":"ip-10-0-0-1.ec2.internal","allocatable":[{"id":"GPU-1","resource":"nvidia.com/gpu"}]}`)
	f.Add(`{"node":"gpu-1","gpus":[{"uuid":"GPU-1","gpuUtil":150}]}`)
	f.Add(`{"node":"gpu-1","observedAt":"2026-11-22T10:00:00Z"}`)
	f.Add(`not json`)
	f.Fuzz(func(t *testing.T, text string) {
		r, err := NodeReportFromJSON([]byte(text))
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted a report that does not validate: %v", err)
		}
		if _, err := NodeSubject(r.GetNode()); err != nil {
			t.Fatalf("accepted a report without a valid subject: %v", err)
		}
		if r.GetObservedAt() == nil {
			t.Fatal("accepted a report without observed_at")
		}
	})
}
