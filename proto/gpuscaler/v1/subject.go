// Package gpuscalerv1 is gpuscaler's NATS event contract: the NodeReport and QueueReport
// messages (generated from events.proto), the subjects they travel on, and the rules a
// well-formed event follows. Collectors and queue producers publish with it, the scaler
// consumes with it; the two sides share nothing else. It depends on protobuf alone, so a
// queue producer can import it without Kubernetes or NATS libraries.
package gpuscalerv1

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The subjects and the stream that carries them. These are the one source of truth for
// every part that publishes or consumes gpuscaler events.
const (
	// SubjectPrefix begins every gpuscaler v1 subject.
	SubjectPrefix = "gpuscaler.v1"
	// SubjectAll matches every gpuscaler v1 subject: the scaler reads them all.
	SubjectAll = SubjectPrefix + ".>"
	// StreamName is the JetStream stream that keeps the latest report of every node
	// (NodeSubjects). Earlier releases captured SubjectAll in it; the scaler narrows it
	// at start.
	StreamName = "GPUSCALER"
	// QueueStreamName is the JetStream stream that keeps the latest report of every queue
	// producer (QueueSubjects), with limits of its own: however many queues producers
	// invent, their reports fill this stream and never evict a node's report from
	// StreamName.
	QueueStreamName = "GPUSCALER_QUEUES"
	// NodeSubjectPrefix begins every node report's subject.
	NodeSubjectPrefix = SubjectPrefix + "." + nodeKind + "."
	// NodeSubjects matches every node report's subject: stream StreamName captures it.
	NodeSubjects = NodeSubjectPrefix + ">"
	// QueueSubjectPrefix begins every queue report's subject.
	QueueSubjectPrefix = SubjectPrefix + "." + queueKind + "."
	// QueueSubjects matches every queue report's subject: stream QueueStreamName
	// captures it.
	QueueSubjects = QueueSubjectPrefix + ">"

	nodeKind  = "node"
	queueKind = "queue"
)

// MaxQueueNameLen bounds a queue name, in bytes.
const MaxQueueNameLen = 256

// MaxProducerIDLen bounds a producer id, in bytes.
const MaxProducerIDLen = 128

// ErrInvalidSubject reports a subject that is not a gpuscaler v1 subject, or whose names
// break the rules below.
var ErrInvalidSubject = errors.New("invalid subject")

// ErrInvalidName reports a node, namespace or queue name that cannot be used in a subject.
var ErrInvalidName = errors.New("invalid name")

// SubjectKind says what a subject carries.
type SubjectKind int

const (
	// KindNode subjects carry NodeReport.
	KindNode SubjectKind = iota + 1
	// KindQueue subjects carry QueueReport.
	KindQueue
)

// String returns "node" or "queue", the label value metrics use.
func (k SubjectKind) String() string {
	switch k {
	case KindNode:
		return nodeKind
	case KindQueue:
		return queueKind
	default:
		return "unknown"
	}
}

// Subject is a parsed gpuscaler v1 subject.
type Subject struct {
	Kind SubjectKind
	// Node is set for KindNode: the Kubernetes node name, decoded.
	Node string
	// Namespace, Queue and Producer are set for KindQueue.
	Namespace string
	Queue     string
	Producer  string
}

// NodeSubject returns the subject a node's reports travel on:
// gpuscaler.v1.node.<node token>. Kubernetes node names may hold dots
// (ip-10-0-1-7.ec2.internal), which separate NATS subject tokens, so the token spells each
// dot as an underscore; a node name never holds an underscore, so the mapping is one to one.
func NodeSubject(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return SubjectPrefix + "." + nodeKind + "." + strings.ReplaceAll(node, ".", "_"), nil
}

// QueueSubject returns the subject one producer's reports of a queue travel on:
// gpuscaler.v1.queue.<namespace>.<queue>.<producer>. Each producer of a queue has a
// subject of its own, so the stream keeps the last report of each, and the queue reads
// their sum.
func QueueSubject(namespace, queue, producer string) (string, error) {
	if err := ValidateNamespace(namespace); err != nil {
		return "", err
	}
	if err := ValidateQueueName(queue); err != nil {
		return "", err
	}
	if err := ValidateProducerID(producer); err != nil {
		return "", err
	}
	return SubjectPrefix + "." + queueKind + "." + namespace + "." + queue + "." + producer, nil
}

// NamespaceQueueSubjects returns the wildcard that matches every queue subject of a
// namespace, gpuscaler.v1.queue.<namespace>.*.*: what a producer of that namespace may
// publish to when the bus enforces tenancy, and nothing deeper.
func NamespaceQueueSubjects(namespace string) (string, error) {
	if err := ValidateNamespace(namespace); err != nil {
		return "", err
	}
	return SubjectPrefix + "." + queueKind + "." + namespace + ".*.*", nil
}

// InboxPrefix is the prefix of the reply subjects a producer of namespace uses (for the
// stream's acknowledgements): _INBOX.gpuscaler.<namespace>. Where the bus enforces tenancy,
// a producer may subscribe only below its own namespace's prefix, so it cannot read the
// replies meant for other tenants or for the scaler, whose inboxes are _INBOX.<random>.
func InboxPrefix(namespace string) string {
	return "_INBOX.gpuscaler." + namespace
}

// TenantJetStreamAPI returns the prefix under which the scaler's account reaches the
// JetStream API of a namespace's own account, gpuscaler.ns.<namespace>.$JS.API: where a
// namespace may use JetStream, the bus imports that account's consumer info
// ($JS.API.CONSUMER.INFO.>) into the scaler's under this prefix, and the scaler reads the
// work queues of that namespace's triggers through it. It is outside gpuscaler.v1.>, so
// the GPUSCALER stream never captures it.
func TenantJetStreamAPI(namespace string) (string, error) {
	if err := ValidateNamespace(namespace); err != nil {
		return "", err
	}
	return tenantAPIPrefix + namespace + ".$JS.API", nil
}

// TenantConsumerInfoAll matches the consumer info requests the scaler sends to every
// namespace's account: TenantJetStreamAPI(<any namespace>) + ".CONSUMER.INFO.<stream>.<consumer>".
const TenantConsumerInfoAll = tenantAPIPrefix + "*.$JS.API.CONSUMER.INFO.*.*"

const tenantAPIPrefix = "gpuscaler.ns."

// ParseSubject parses a subject built by NodeSubject or QueueSubject. It allocates only
// for a node name that holds dots.
func ParseSubject(subject string) (Subject, error) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix+".")
	if !ok {
		return Subject{}, fmt.Errorf("%w %q: want prefix %s.", ErrInvalidSubject, subject, SubjectPrefix)
	}
	kind, rest, _ := strings.Cut(rest, ".")
	switch kind {
	case nodeKind:
		if strings.Contains(rest, ".") {
			return Subject{}, fmt.Errorf("%w %q: want %s.node.<node>", ErrInvalidSubject, subject, SubjectPrefix)
		}
		node := rest
		if strings.Contains(rest, "_") {
			node = strings.ReplaceAll(rest, "_", ".")
		}
		if err := ValidateNodeName(node); err != nil {
			return Subject{}, fmt.Errorf("%w %q: %w", ErrInvalidSubject, subject, err)
		}
		return Subject{Kind: KindNode, Node: node}, nil
	case queueKind:
		ns, rest, ok1 := strings.Cut(rest, ".")
		queue, producer, ok2 := strings.Cut(rest, ".")
		if !ok1 || !ok2 || strings.Contains(producer, ".") {
			return Subject{}, fmt.Errorf("%w %q: want %s.queue.<namespace>.<queue>.<producer>", ErrInvalidSubject, subject, SubjectPrefix)
		}
		if err := ValidateNamespace(ns); err != nil {
			return Subject{}, fmt.Errorf("%w %q: %w", ErrInvalidSubject, subject, err)
		}
		if err := ValidateQueueName(queue); err != nil {
			return Subject{}, fmt.Errorf("%w %q: %w", ErrInvalidSubject, subject, err)
		}
		if err := ValidateProducerID(producer); err != nil {
			return Subject{}, fmt.Errorf("%w %q: %w", ErrInvalidSubject, subject, err)
		}
		return Subject{Kind: KindQueue, Namespace: ns, Queue: queue, Producer: producer}, nil
	default:
		return Subject{}, fmt.Errorf("%w %q: unknown kind %q, want node or queue", ErrInvalidSubject, subject, kind)
	}
}

// ValidateNodeName checks a Kubernetes node name: a DNS-1123 subdomain (lower-case letters,
// digits, '-' and '.', at most 253 characters, each dot-separated part starting and ending
// with a letter or digit).
func ValidateNodeName(node string) error {
	if node == "" {
		return fmt.Errorf("%w: node name is empty", ErrInvalidName)
	}
	if len(node) > 253 {
		return fmt.Errorf("%w: node name %.20q… is %d characters, want at most 253", ErrInvalidName, node, len(node))
	}
	for label := range strings.SplitSeq(node, ".") {
		if !isDNSLabel(label) {
			return fmt.Errorf("%w: node name %q is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')", ErrInvalidName, node)
		}
	}
	return nil
}

// ValidateNamespace checks a Kubernetes namespace name: a DNS-1123 label (lower-case
// letters, digits and '-', at most 63 characters, starting and ending with a letter or digit).
func ValidateNamespace(namespace string) error {
	if namespace == "" {
		return fmt.Errorf("%w: namespace is empty", ErrInvalidName)
	}
	if len(namespace) > 63 || !isDNSLabel(namespace) {
		return fmt.Errorf("%w: namespace %q is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)", ErrInvalidName, namespace)
	}
	return nil
}

// ValidateQueueName checks a queue name: one NATS subject token, so no '.', '*', '>' or
// white space, no control characters, valid UTF-8, 1 to MaxQueueNameLen bytes.
func ValidateQueueName(queue string) error {
	return validateToken("queue name", queue, MaxQueueNameLen)
}

// ValidateProducerID checks a producer id: one NATS subject token, as a queue name, of
// 1 to MaxProducerIDLen bytes.
func ValidateProducerID(id string) error {
	return validateToken("producer id", id, MaxProducerIDLen)
}

// validateToken checks that s, the what of a subject, is one subject token of at most
// maxLen bytes.
func validateToken(what, s string, maxLen int) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, what)
	}
	if len(s) > maxLen {
		return fmt.Errorf("%w: %s %.20q… is %d bytes, want at most %d", ErrInvalidName, what, s, len(s), maxLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidName, what, s)
	}
	for _, r := range s {
		if !tokenRune(r) {
			return fmt.Errorf("%w: %s %q holds %q; '.', '*', '>', white space and control characters are not allowed", ErrInvalidName, what, s, r)
		}
	}
	return nil
}

// ProducerID turns s (a host or pod name, which may hold dots) into a valid producer id:
// each rune a subject token cannot hold becomes '-', and it is cut to MaxProducerIDLen
// bytes. An s with nothing left gives "producer".
func ProducerID(s string) string {
	s = strings.ToValidUTF8(s, "-")
	s = strings.Map(func(r rune) rune {
		if tokenRune(r) {
			return r
		}
		return '-'
	}, s)
	for len(s) > MaxProducerIDLen {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	if s == "" {
		return "producer"
	}
	return s
}

// tokenRune reports whether r may stand in a subject token gpuscaler builds from a name.
func tokenRune(r rune) bool {
	return r != '.' && r != '*' && r != '>' && r != utf8.RuneError && !unicode.IsSpace(r) && !unicode.IsControl(r)
}

// isDNSLabel reports whether s is 1 to 63 lower-case letters, digits and '-', starting and
// ending with a letter or digit.
func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
