package traces

import (
	"cmp"
	"io"
	"math"
	"slices"
	"time"
)

// GenTD26Request is one request of GenTD26's LoRA request trace (lora_request_trace.csv in
// alibaba/clusterdata cluster-trace-v2026-GenAI): a production Stable Diffusion service.
type GenTD26Request struct {
	At         time.Time     // arrival (gmt_create), 1 s resolution, UTC (the file gives no zone)
	Type       string        // predict_type, e.g. TXT_2_IMG, IMG_2_IMG, INPAINTING
	Status     string        // predict_status: SUCCEED, FAILED or PENDING
	Exec       time.Duration // exec_time_seconds: time spent executing, 0 to 24 h
	Group      string        // groupId: the tenant
	Checkpoint string        // checkpoint_model_version_id: the model, one GPU deployment per checkpoint; never empty
}

// GenTD26's request columns.
const (
	colGenTD26At         = "gmt_create"
	colGenTD26Type       = "predict_type"
	colGenTD26Status     = "predict_status"
	colGenTD26Exec       = "exec_time_seconds"
	colGenTD26Group      = "groupId"
	colGenTD26Checkpoint = "checkpoint_model_version_id"
)

// ReadGenTD26 reads a whole GenTD26 request trace and returns its requests sorted by
// arrival (stable: requests in the same second keep their file order).
//
// Every field is required, except in one case the trace has: a PENDING request with no
// checkpoint (and no model, steps or images) never reached a deployment, so it cannot be
// replayed against one and is left out. Any other row with an empty or invalid field is
// an error naming its line, column and value, as is a file with no requests.
func ReadGenTD26(r io.Reader) ([]GenTD26Request, error) {
	t, err := newTable(r, "GenTD26 requests", colGenTD26At, colGenTD26Type, colGenTD26Status,
		colGenTD26Exec, colGenTD26Group, colGenTD26Checkpoint)
	if err != nil {
		return nil, err
	}
	reqs, err := readRows(t, func(row row) (GenTD26Request, bool, error) {
		at, errAt := row.time(colGenTD26At, 0)
		typ, errType := row.text(colGenTD26Type)
		status, errStatus := row.text(colGenTD26Status)
		exec, errExec := row.float(colGenTD26Exec, 0, (24 * time.Hour).Seconds())
		group, errGroup := row.text(colGenTD26Group)
		if err := cmp.Or(errAt, errType, errStatus, errExec, errGroup); err != nil {
			return GenTD26Request{}, false, err
		}
		if status == "PENDING" && row.str(colGenTD26Checkpoint) == "" {
			return GenTD26Request{}, false, nil
		}
		ckpt, err := row.text(colGenTD26Checkpoint)
		return GenTD26Request{
			At:         at,
			Type:       typ,
			Status:     status,
			Exec:       time.Duration(math.Round(exec * float64(time.Second))),
			Group:      group,
			Checkpoint: ckpt,
		}, true, err
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(reqs, func(a, b GenTD26Request) int { return a.At.Compare(b.At) })
	return reqs, nil
}

// ReadLoadLatency reads GenTD26's measured base-model load latencies
// (basemodel_update_latency: columns timestamp_anon, value, container_ip; value in
// milliseconds): the cold start a replica pays before it serves. It returns them in
// file order. A value that is negative, not a number or over an hour is an error naming
// its line, as is a file with no values.
func ReadLoadLatency(r io.Reader) ([]time.Duration, error) {
	const col = "value"
	t, err := newTable(r, "GenTD26 load latencies", col)
	if err != nil {
		return nil, err
	}
	return readRows(t, func(row row) (time.Duration, bool, error) {
		ms, err := row.float(col, 0, float64(time.Hour/time.Millisecond))
		return time.Duration(math.Round(ms * float64(time.Millisecond))), true, err
	})
}
