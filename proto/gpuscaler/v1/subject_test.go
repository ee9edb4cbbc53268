package gpuscalerv1

import (
	"errors"
	"strings"
	"testing"
)

func TestNodeSubject(t *testing.T) {
	tests := map[string]struct {
		node, want string
		wantErr    bool
	}{
		"plain":              {node: "gpu-node-1", want: "gpuscaler.v1.node.gpu-node-1"},
		"dotted EKS name":    {node: "ip-10-0-1-7.ec2.internal", want: "gpuscaler.v1.node.ip-10-0-1-7_ec2_internal"},
		"empty":              {node: "", wantErr: true},
		"upper case":         {node: "Node1", wantErr: true},
		"wildcard":           {node: "*", wantErr: true},
		"full wildcard":      {node: ">", wantErr: true},
		"underscore":         {node: "a_b", wantErr: true},
		"space":              {node: "a b", wantErr: true},
		"leading dash":       {node: "-a", wantErr: true},
		"empty dotted label": {node: "a..b", wantErr: true},
		"too long":           {node: strings.Repeat("a", 254), wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := NodeSubject(tc.node)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidName) {
					t.Fatalf("NodeSubject(%q) = %q, %v; want ErrInvalidName", tc.node, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NodeSubject(%q) = %q, %v; want %q", tc.node, got, err, tc.want)
			}
			parsed, err := ParseSubject(got)
			if err != nil || parsed != (Subject{Kind: KindNode, Node: tc.node}) {
				t.Fatalf("ParseSubject(%q) = %+v, %v; want node %q", got, parsed, err, tc.node)
			}
		})
	}
}

func TestQueueSubject(t *testing.T) {
	tests := map[string]struct {
		ns, queue, want string
		wantErr         bool
	}{
		"plain":            {ns: "default", queue: "jobs", want: "gpuscaler.v1.queue.default.jobs"},
		"punctuation":      {ns: "ml", queue: "train:high_prio-2", want: "gpuscaler.v1.queue.ml.train:high_prio-2"},
		"unicode":          {ns: "ml", queue: "очередь", want: "gpuscaler.v1.queue.ml.очередь"},
		"dot in queue":     {ns: "ml", queue: "a.b", wantErr: true},
		"star":             {ns: "ml", queue: "*", wantErr: true},
		"gt":               {ns: "ml", queue: "a>", wantErr: true},
		"tab":              {ns: "ml", queue: "a\tb", wantErr: true},
		"nbsp":             {ns: "ml", queue: "a\u00a0b", wantErr: true},
		"control":          {ns: "ml", queue: "a\x00b", wantErr: true},
		"bad utf8":         {ns: "ml", queue: "a\xffb", wantErr: true},
		"empty queue":      {ns: "ml", queue: "", wantErr: true},
		"long queue":       {ns: "ml", queue: strings.Repeat("q", MaxQueueNameLen+1), wantErr: true},
		"empty namespace":  {ns: "", queue: "q", wantErr: true},
		"dotted namespace": {ns: "a.b", queue: "q", wantErr: true},
		"upper namespace":  {ns: "Default", queue: "q", wantErr: true},
		"long namespace":   {ns: strings.Repeat("n", 64), queue: "q", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := QueueSubject(tc.ns, tc.queue)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidName) {
					t.Fatalf("QueueSubject(%q, %q) = %q, %v; want ErrInvalidName", tc.ns, tc.queue, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("QueueSubject(%q, %q) = %q, %v; want %q", tc.ns, tc.queue, got, err, tc.want)
			}
			parsed, err := ParseSubject(got)
			want := Subject{Kind: KindQueue, Namespace: tc.ns, Queue: tc.queue}
			if err != nil || parsed != want {
				t.Fatalf("ParseSubject(%q) = %+v, %v; want %+v", got, parsed, err, want)
			}
		})
	}
}

func TestParseSubjectRejects(t *testing.T) {
	for _, s := range []string{
		"", "gpuscaler", "gpuscaler.v1", "gpuscaler.v1.", "gpuscaler.v2.node.a", "other.v1.node.a",
		"gpuscaler.v1.pod.a", "gpuscaler.v1.node", "gpuscaler.v1.node.", "gpuscaler.v1.node.a.b",
		"gpuscaler.v1.node.a__b", "gpuscaler.v1.node.A", "gpuscaler.v1.queue.ns",
		"gpuscaler.v1.queue.ns.", "gpuscaler.v1.queue.ns.q.extra", "gpuscaler.v1.queue.NS.q",
		"gpuscaler.v1.queue..q", "gpuscaler.v1.queue.ns.*", "gpuscaler.v1.>",
	} {
		if got, err := ParseSubject(s); !errors.Is(err, ErrInvalidSubject) {
			t.Errorf("ParseSubject(%q) = %+v, %v; want ErrInvalidSubject", s, got, err)
		}
	}
}

// FuzzParseSubject checks that any subject either fails to parse or round-trips through
// the builder to the same string.
func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{
		"gpuscaler.v1.node.gpu-1", "gpuscaler.v1.node.ip-10-0-0-1_ec2_internal",
		"gpuscaler.v1.queue.default.jobs", "gpuscaler.v1.queue.a.b.c", "gpuscaler.v1.node._",
		"gpuscaler.v1.queue.ns.\xff", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		s, err := ParseSubject(subject)
		if err != nil {
			if !errors.Is(err, ErrInvalidSubject) {
				t.Fatalf("ParseSubject(%q) error %v does not wrap ErrInvalidSubject", subject, err)
			}
			return
		}
		var rebuilt string
		switch s.Kind {
		case KindNode:
			rebuilt, err = NodeSubject(s.Node)
		case KindQueue:
			rebuilt, err = QueueSubject(s.Namespace, s.Queue)
		default:
			t.Fatalf("ParseSubject(%q) returned kind %v", subject, s.Kind)
		}
		if err != nil || rebuilt != subject {
			t.Fatalf("ParseSubject(%q) = %+v, which rebuilds to %q, %v", subject, s, rebuilt, err)
		}
	})
}
