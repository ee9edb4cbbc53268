package gpuscalerv1

import (
	"fmt"
	"time"
)

// Describe says what the cold start is and whose figure it is, as `gpuscaler explain`
// and the scaler's status page write it: "45s, the trigger's coldStart key", "31s,
// measured by producer "gw-1"", "28s, measured by the collector of node n1 on pod
// ml/llm-0", or "unknown" for nil.
func (c *ColdStart) Describe() string {
	if c == nil {
		return "unknown"
	}
	d := time.Duration(c.GetSeconds() * float64(time.Second)).Round(100 * time.Millisecond)
	switch c.GetSource() {
	case "trigger":
		return fmt.Sprintf("%s, the trigger's coldStart key", d)
	case "producer":
		return fmt.Sprintf("%s, measured by producer %q", d, c.GetProducerId())
	case "collector":
		return fmt.Sprintf("%s, measured by the collector of node %s on pod %s", d, c.GetNode(), c.GetPod())
	}
	return fmt.Sprintf("%s (%s)", d, c.GetSource())
}
