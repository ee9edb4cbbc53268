package metadata

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseTolerations(t *testing.T) {
	tests := map[string]struct {
		in   string
		want []Toleration
	}{
		"key=value:effect":      {"dedicated=gpu:NoSchedule", []Toleration{{Key: "dedicated", Value: "gpu", Effect: "NoSchedule"}}},
		"key:effect is Exists":  {"nvidia.com/gpu:NoSchedule", []Toleration{{Key: "nvidia.com/gpu", Exists: true, Effect: "NoSchedule"}}},
		"key=value, any effect": {"team=ml", []Toleration{{Key: "team", Value: "ml"}}},
		"key alone is Exists":   {"ToBeDeletedByClusterAutoscaler", []Toleration{{Key: "ToBeDeletedByClusterAutoscaler", Exists: true}}},
		"empty value is Equal":  {"team=:NoExecute", []Toleration{{Key: "team", Effect: "NoExecute"}}},
		"star is every key":     {"*", []Toleration{{Exists: true}}},
		"star with effect":      {"*:NoSchedule", []Toleration{{Exists: true, Effect: "NoSchedule"}}},
		"PreferNoSchedule":      {"a:PreferNoSchedule", []Toleration{{Key: "a", Exists: true, Effect: "PreferNoSchedule"}}},
		"several, white space": {" key=value:NoSchedule , dedicated:NoSchedule,node.kubernetes.io/unschedulable ", []Toleration{
			{Key: "key", Value: "value", Effect: "NoSchedule"},
			{Key: "dedicated", Exists: true, Effect: "NoSchedule"},
			{Key: "node.kubernetes.io/unschedulable", Exists: true},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseTolerations(tc.in)
			if err != nil {
				t.Fatalf("ParseTolerations(%q): %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("ParseTolerations(%q): got %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseTolerationsRefuses(t *testing.T) {
	for _, in := range []string{
		"", " ", ",", "a,", ",a", "a,,b", // empty entries
		"a:", ":NoSchedule", "=v", "=v:NoSchedule", "a=b:c:NoSchedule", "a:NoSchedule:NoExecute",
		"a:noschedule", "a:Never", "a: NoSchedule", // effects are Kubernetes' names, case and all
		"*=v", "*=:NoSchedule", "**", // an empty key tolerates every value: Exists only
		"a b", "a=b c", "-a", "a-", "a=-b", "a/b/c", "/a", "a=b/c", "a\x00", "a=\x00",
		strings.Repeat("k", 64), "a=" + strings.Repeat("v", 64),
		strings.Repeat("a,", maxTolerations) + "a",
	} {
		t.Run(caseName(in), func(t *testing.T) {
			got, err := ParseTolerations(in)
			if err == nil {
				t.Fatalf("ParseTolerations(%q): got %+v, want an error", in, got)
			}
		})
	}
}

// TestTolerates follows Kubernetes' Toleration.ToleratesTaint (k8s.io/api v0.36.4,
// core/v1/toleration.go): an effect, when given, must be the taint's; a key, when given,
// must be the taint's; then Exists matches any value and Equal (the operator left empty
// included) the value alone. The comparison operators Lt and Gt, behind the alpha gate
// TaintTolerationComparisonOperators, are not offered.
func TestTolerates(t *testing.T) {
	noSchedule := func(k, v string) Taint { return Taint{Key: k, Value: v, Effect: "NoSchedule"} }
	tests := []struct {
		tol   string
		taint Taint
		want  bool
	}{
		{"dedicated=gpu:NoSchedule", noSchedule("dedicated", "gpu"), true},
		{"dedicated=gpu:NoSchedule", noSchedule("dedicated", "cpu"), false},
		{"dedicated=gpu:NoSchedule", Taint{Key: "dedicated", Value: "gpu", Effect: "NoExecute"}, false},
		{"dedicated=gpu", Taint{Key: "dedicated", Value: "gpu", Effect: "NoExecute"}, true},
		{"dedicated:NoSchedule", noSchedule("dedicated", "anything"), true},
		{"dedicated:NoSchedule", noSchedule("dedicated", ""), true},
		{"dedicated=:NoSchedule", noSchedule("dedicated", ""), true},
		{"dedicated=:NoSchedule", noSchedule("dedicated", "x"), false},
		{"dedicated", Taint{Key: "dedicated", Value: "x", Effect: "NoExecute"}, true},
		{"other", noSchedule("dedicated", ""), false},
		{"*", Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"}, true},
		{"*:NoExecute", noSchedule("a", "b"), false},
		{"*:NoExecute", Taint{Key: "node.kubernetes.io/unreachable", Effect: "NoExecute"}, true},
	}
	for _, tc := range tests {
		tols, err := ParseTolerations(tc.tol)
		if err != nil {
			t.Fatal(err)
		}
		if got := tols[0].Tolerates(tc.taint); got != tc.want {
			t.Errorf("%q tolerates %+v: got %v, want %v", tc.tol, tc.taint, got, tc.want)
		}
	}
}

// FuzzParseTolerations: any input is parsed or refused with a *Error naming the key and
// the value; what is parsed prints back to a string that parses to the same tolerations.
func FuzzParseTolerations(f *testing.F) {
	for _, s := range []string{"key=value:NoSchedule,dedicated:NoSchedule", "*", "*:NoExecute", "a=", "a=b:c:d", ",", "nvidia.com/gpu", "x=\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		tols, err := ParseTolerations(in)
		if err != nil {
			var me *Error
			if !errors.As(err, &me) || me.Key != KeyTolerations || me.Value != in || !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseTolerations(%q): error %v, want a *Error for %s with the value", in, err, KeyTolerations)
			}
			return
		}
		if len(tols) == 0 || len(tols) > maxTolerations {
			t.Fatalf("ParseTolerations(%q): %d tolerations, want 1 to %d", in, len(tols), maxTolerations)
		}
		for _, tol := range tols {
			if tol.Key == "" && !tol.Exists {
				t.Errorf("ParseTolerations(%q): %+v: an empty key with Equal, which Kubernetes refuses", in, tol)
			}
			if !slices.Contains([]string{"", "NoSchedule", "NoExecute", "PreferNoSchedule"}, tol.Effect) {
				t.Errorf("ParseTolerations(%q): effect %q", in, tol.Effect)
			}
		}
		again, err := ParseTolerations(FormatTolerations(tols))
		if err != nil || !slices.Equal(again, tols) {
			t.Fatalf("ParseTolerations(%q) = %+v, printed %q, parsed again %+v, %v", in, tols, FormatTolerations(tols), again, err)
		}
	})
}
