package metadata

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Toleration is one toleration a trigger's Jobs carry, as a Pod's spec.tolerations holds
// it: a taint it tolerates on a node that capacity counts (see Tolerates).
type Toleration struct {
	// Key is the taint key; empty (written "*") with Exists tolerates every taint.
	Key string
	// Exists tolerates any value of Key (operator Exists); otherwise the value must be
	// Value (operator Equal).
	Exists bool
	Value  string
	// Effect is the taint effect tolerated; empty tolerates every effect.
	Effect string
}

// Taint is a node's taint as Tolerates matches it.
type Taint struct{ Key, Value, Effect string }

// Tolerates reports whether t tolerates taint, as Kubernetes' Toleration.ToleratesTaint
// decides (k8s.io/api core/v1/toleration.go): an effect, when t has one, must be the
// taint's; a key, when t has one, must be the taint's; then Exists matches any value and
// Equal the taint's value alone.
func (t Toleration) Tolerates(taint Taint) bool {
	if t.Effect != "" && t.Effect != taint.Effect {
		return false
	}
	if t.Key != "" && t.Key != taint.Key {
		return false
	}
	return t.Exists || t.Value == taint.Value
}

// String writes t in the form ParseTolerations reads.
func (t Toleration) String() string {
	var b strings.Builder
	switch {
	case t.Key == "":
		b.WriteString("*")
	case t.Exists:
		b.WriteString(t.Key)
	default:
		b.WriteString(t.Key + "=" + t.Value)
	}
	if t.Effect != "" {
		b.WriteString(":" + t.Effect)
	}
	return b.String()
}

// FormatTolerations writes tolerations in the form ParseTolerations reads.
func FormatTolerations(tolerations []Toleration) string {
	parts := make([]string, len(tolerations))
	for i, t := range tolerations {
		parts[i] = t.String()
	}
	return strings.Join(parts, ",")
}

// maxTolerations bounds the tolerations of one trigger: a Pod carries a handful.
const maxTolerations = 64

// tolerationsWant is what an invalid tolerations value is told.
const tolerationsWant = `comma-separated tolerations, each key=value:Effect (operator Equal), key:Effect ` +
	`(operator Exists: any value), or either without :Effect (every effect); key "*" with no value tolerates every key; ` +
	`a taint key is a Kubernetes qualified name, a value a label value, an Effect NoSchedule, NoExecute or PreferNoSchedule; ` +
	`such as "dedicated=gpu:NoSchedule,nvidia.com/gpu:NoSchedule"`

// ParseTolerations reads the tolerations of a trigger's tolerations key:
//
//	key=value:Effect   Equal: the taint key with that value, of that effect
//	key=value          Equal, any effect
//	key:Effect         Exists: the taint key with any value, of that effect
//	key                Exists, any effect
//	*:Effect, *        every taint key (of that effect)
//
// separated by commas, white space around each ignored. It is kubectl taint's syntax,
// read as a toleration: where a pod spec must name the operator, a value given means
// Equal and none means Exists. Every error is a *Error for KeyTolerations.
func ParseTolerations(s string) ([]Toleration, error) {
	fail := func(why string) error {
		return &Error{Key: KeyTolerations, Value: s, Want: tolerationsWant + " (" + why + ")"}
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxTolerations {
		return nil, fail(fmt.Sprintf("%d tolerations, more than %d", len(parts), maxTolerations))
	}
	out := make([]Toleration, 0, len(parts))
	for _, part := range parts {
		item := strings.TrimSpace(part)
		if item == "" {
			return nil, fail("an empty toleration")
		}
		var t Toleration
		rest, effect, hasEffect := strings.Cut(item, ":")
		if hasEffect {
			switch effect {
			case "NoSchedule", "NoExecute", "PreferNoSchedule":
				t.Effect = effect
			default:
				return nil, fail(fmt.Sprintf("effect %q in %q", effect, item))
			}
		}
		key, value, hasValue := strings.Cut(rest, "=")
		switch {
		case key == "*" && hasValue:
			return nil, fail(fmt.Sprintf("%q: key * tolerates every taint, whatever its value, so it takes no value", item))
		case key == "*":
			t.Exists = true
		default:
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				return nil, fail(fmt.Sprintf("key %q in %q: %s", key, item, strings.Join(errs, "; ")))
			}
			t.Key = key
			t.Exists = !hasValue
		}
		if hasValue {
			if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
				return nil, fail(fmt.Sprintf("value %q in %q: %s", value, item, strings.Join(errs, "; ")))
			}
			t.Value = value
		}
		out = append(out, t)
	}
	return out, nil
}
