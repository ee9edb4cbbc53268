// Package replay runs real production traces through gpuscaler's own decision code on a
// virtual clock: the scaler's state, metadata parsing, policies and metrics, fed events
// built as producers and collectors build them and asked exactly what KEDA asks; KEDA's
// and the HPA's published rules (kedarules) acting on the answers; and a model of the
// cluster, where a new replica loads its model for a time drawn from a real load-latency
// distribution and then serves FIFO at the concurrency the workload allows (the
// inference package models inference services; openb.go models GPU tasks as Jobs).
// Every policy a user would compare runs on the same trace in the same replay, and the
// output is the same for the same seed. `gpuscaler replay` runs it.
package replay
