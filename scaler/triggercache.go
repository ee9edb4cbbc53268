package scaler

import (
	"hash/maphash"
	"maps"
	"sync"
)

// triggerCache remembers what a trigger's metadata parsed to, by namespace and metadata.
// KEDA sends a trigger's same metadata on every call, and parsing it, its label selectors
// above all, costs several times what answering from the state does.
type triggerCache struct {
	seed maphash.Seed
	max  int

	mu      sync.RWMutex // guards entries and size
	entries map[uint64][]*cachedTrigger
	size    int
}

// cachedTrigger is one parsed trigger. It is never changed once made, and the status
// page's call recorder keys on its address: one entry, one trigger.
type cachedTrigger struct {
	namespace string
	metadata  map[string]string
	t         *Trigger
	err       error
}

// defaultTriggerCacheSize bounds the parsed triggers kept: each is a few hundred bytes,
// and a cluster has as many as it has ScaledObject and ScaledJob triggers.
const defaultTriggerCacheSize = 100_000

func newTriggerCache(max int) *triggerCache {
	return &triggerCache{seed: maphash.MakeSeed(), max: max, entries: make(map[uint64][]*cachedTrigger)}
}

// hash combines the namespace and every key and value, independent of the map's order.
func (c *triggerCache) hash(namespace string, md map[string]string) uint64 {
	h := maphash.String(c.seed, namespace)
	for k, v := range md {
		kh, vh := maphash.String(c.seed, k), maphash.String(c.seed, v)
		h += kh ^ (vh * 0x9e3779b97f4a7c15)
	}
	return h
}

// get returns what parse gave for the namespace and metadata, calling it when they were
// not seen before. parse must depend on nothing else.
func (c *triggerCache) get(namespace string, md map[string]string, parse func() (*Trigger, error)) (*Trigger, error) {
	e := c.entry(namespace, md, parse)
	return e.t, e.err
}

// entry is get's entry itself.
func (c *triggerCache) entry(namespace string, md map[string]string, parse func() (*Trigger, error)) *cachedTrigger {
	h := c.hash(namespace, md)
	c.mu.RLock()
	for _, e := range c.entries[h] {
		if e.namespace == namespace && maps.Equal(e.metadata, md) {
			c.mu.RUnlock()
			return e
		}
	}
	c.mu.RUnlock()
	t, err := parse()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.size >= c.max { // a flood of ever new metadata: start afresh rather than grow
		clear(c.entries)
		c.size = 0
	}
	e := &cachedTrigger{namespace: namespace, metadata: maps.Clone(md), t: t, err: err}
	c.entries[h] = append(c.entries[h], e)
	c.size++
	return e
}
