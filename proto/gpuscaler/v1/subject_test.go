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
		ns, queue, producer, want string
		wantErr                   bool
	}{
		"plain":            {ns: "default", queue: "jobs", producer: "gw-0", want: "gpuscaler.v1.queue.default.jobs.gw-0"},
		"punctuation":      {ns: "ml", queue: "train:high_prio-2", producer: "p_1:a", want: "gpuscaler.v1.queue.ml.train:high_prio-2.p_1:a"},
		"unicode":          {ns: "ml", queue: "очередь", producer: "производитель", want: "gpuscaler.v1.queue.ml.очередь.производитель"},
		"dot in queue":     {ns: "ml", queue: "a.b", producer: "p", wantErr: true},
		"star":             {ns: "ml", queue: "*", producer: "p", wantErr: true},
		"gt":               {ns: "ml", queue: "a>", producer: "p", wantErr: true},
		"tab":              {ns: "ml", queue: "a\tb", producer: "p", wantErr: true},
		"nbsp":             {ns: "ml", queue: "a\u00a0b", producer: "p", wantErr: true},
		"control":          {ns: "ml", queue: "a\x00b", producer: "p", wantErr: true},
		"bad utf8":         {ns: "ml", queue: "a\xffb", producer: "p", wantErr: true},
		"empty queue":      {ns: "ml", queue: "", producer: "p", wantErr: true},
		"long queue":       {ns: "ml", queue: strings.Repeat("q", MaxQueueNameLen+1), producer: "p", wantErr: true},
		"empty namespace":  {ns: "", queue: "q", producer: "p", wantErr: true},
		"dotted namespace": {ns: "a.b", queue: "q", producer: "p", wantErr: true},
		"upper namespace":  {ns: "Default", queue: "q", producer: "p", wantErr: true},
		"long namespace":   {ns: strings.Repeat("n", 64), queue: "q", producer: "p", wantErr: true},
		"empty producer":   {ns: "ml", queue: "q", producer: "", wantErr: true},
		"dotted producer":  {ns: "ml", queue: "q", producer: "gw.example", wantErr: true},
		"wild producer":    {ns: "ml", queue: "q", producer: ">", wantErr: true},
		"spaced producer":  {ns: "ml", queue: "q", producer: "a b", wantErr: true},
		"long producer":    {ns: "ml", queue: "q", producer: strings.Repeat("p", MaxProducerIDLen+1), wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := QueueSubject(tc.ns, tc.queue, tc.producer)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidName) {
					t.Fatalf("QueueSubject(%q, %q, %q) = %q, %v; want ErrInvalidName", tc.ns, tc.queue, tc.producer, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("QueueSubject(%q, %q, %q) = %q, %v; want %q", tc.ns, tc.queue, tc.producer, got, err, tc.want)
			}
			parsed, err := ParseSubject(got)
			want := Subject{Kind: KindQueue, Namespace: tc.ns, Queue: tc.queue, Producer: tc.producer}
			if err != nil || parsed != want {
				t.Fatalf("ParseSubject(%q) = %+v, %v; want %+v", got, parsed, err, want)
			}
		})
	}
}

func TestProducerID(t *testing.T) {
	tests := map[string]string{
		"gateway-7d9f-x2":          "gateway-7d9f-x2",
		"ip-10-0-1-7.ec2.internal": "ip-10-0-1-7-ec2-internal",
		"a b\tc*d>e":               "a-b-c-d-e",
		"":                         "producer",
		"\xff":                     "-",
		strings.Repeat("é", 100):   strings.Repeat("é", MaxProducerIDLen/2),
	}
	for in, want := range tests {
		got := ProducerID(in)
		if got != want {
			t.Errorf("ProducerID(%q) = %q, want %q", in, got, want)
		}
		if err := ValidateProducerID(got); err != nil {
			t.Errorf("ProducerID(%q) = %q, which ValidateProducerID refuses: %v", in, got, err)
		}
	}
}

// TestNamespaceQueueSubjectsIsOneLevel checks the wildcard a producer may publish to
// matches its queues' producer subjects and nothing deeper, with NATS's own matcher.
func TestNamespaceQueueSubjectsIsOneLevel(t *testing.T) {
	w, err := NamespaceQueueSubjects("ml")
	if err != nil {
		t.Fatal(err)
	}
	for subject, want := range map[string]bool{
		"gpuscaler.v1.queue.ml.jobs.gw-0":       true,
		"gpuscaler.v1.queue.ml.jobs":            false,
		"gpuscaler.v1.queue.ml.jobs.gw-0.extra": false,
		"gpuscaler.v1.queue.other.jobs.gw-0":    false,
	} {
		if got := subjectMatches(w, subject); got != want {
			t.Errorf("%s matches %s: %v, want %v", w, subject, got, want)
		}
	}
}

// subjectMatches is NATS's token matching of a literal subject against a wildcard, as
// the server applies publish permissions (nats-server server/sublist.go, matchLiteral).
func subjectMatches(wildcard, subject string) bool {
	w, s := strings.Split(wildcard, "."), strings.Split(subject, ".")
	for i, tok := range w {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(w) == len(s)
}

func TestParseSubjectRejects(t *testing.T) {
	for _, s := range []string{
		"", "gpuscaler", "gpuscaler.v1", "gpuscaler.v1.", "gpuscaler.v2.node.a", "other.v1.node.a",
		"gpuscaler.v1.pod.a", "gpuscaler.v1.node", "gpuscaler.v1.node.", "gpuscaler.v1.node.a.b",
		"gpuscaler.v1.node.a__b", "gpuscaler.v1.node.A", "gpuscaler.v1.queue.ns",
		"gpuscaler.v1.queue.ns.", "gpuscaler.v1.queue.ns.q", "gpuscaler.v1.queue.ns.q.p.extra",
		"gpuscaler.v1.queue.NS.q.p", "gpuscaler.v1.queue..q.p", "gpuscaler.v1.queue.ns.*.p",
		"gpuscaler.v1.queue.ns.q.*", "gpuscaler.v1.queue.ns.q.", "gpuscaler.v1.>",
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
		"gpuscaler.v1.queue.default.jobs.gw-0", "gpuscaler.v1.queue.a.b.c", "gpuscaler.v1.node._",
		"gpuscaler.v1.queue.ns.\xff.p", "gpuscaler.v1.queue.ns.q.\xff", "",
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
			rebuilt, err = QueueSubject(s.Namespace, s.Queue, s.Producer)
		default:
			t.Fatalf("ParseSubject(%q) returned kind %v", subject, s.Kind)
		}
		if err != nil || rebuilt != subject {
			t.Fatalf("ParseSubject(%q) = %+v, which rebuilds to %q, %v", subject, s, rebuilt, err)
		}
	})
}
