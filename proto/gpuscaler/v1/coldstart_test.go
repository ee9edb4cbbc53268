package gpuscalerv1

import "testing"

func TestColdStartDescribe(t *testing.T) {
	tests := map[string]struct {
		c    *ColdStart
		want string
	}{
		"unknown":   {nil, "unknown"},
		"trigger":   {&ColdStart{Seconds: 45, Source: "trigger"}, "45s, the trigger's coldStart key"},
		"producer":  {&ColdStart{Seconds: 31.04, Source: "producer", ProducerId: "gw-1"}, `31s, measured by producer "gw-1"`},
		"collector": {&ColdStart{Seconds: 28.25, Source: "collector", Pod: "ml/llm-0", Node: "n1"}, "28.3s, measured by the collector of node n1 on pod ml/llm-0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.c.Describe(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
