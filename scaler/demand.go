package scaler

import (
	"time"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
	"github.com/gpuscaler/gpuscaler/scaler/demand"
)

// nextDemand is the queue's traffic estimate once report r, stored at stored, follows
// old (nil: the queue's first report since this scaler started).
func (old *queueEntry) nextDemand(r *gpuscalerv1.QueueReport, stored time.Time) demand.Estimate {
	if old == nil {
		return demand.Estimate{}
	}
	return old.demand.Next(old.report, r, stored.Sub(old.stored))
}
