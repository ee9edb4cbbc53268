package traces

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// AzureLLMRequest is one request of Azure's LLM inference trace
// (AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv or _code.csv). The trace has
// no service times: a replay needs its own model of tokens to seconds.
type AzureLLMRequest struct {
	At              time.Time // arrival (TIMESTAMP), up to 100 ns resolution, UTC (the file gives no zone)
	ContextTokens   int       // prompt tokens, 0 to 10,000,000
	GeneratedTokens int       // output tokens, 0 to 10,000,000
}

// Azure's LLM trace columns, and the most tokens a request is believed to have.
const (
	colAzureAt        = "TIMESTAMP"
	colAzureContext   = "ContextTokens"
	colAzureGenerated = "GeneratedTokens"
	maxAzureTokens    = 10_000_000
)

// ReadAzureLLM reads a whole Azure LLM inference trace and returns its requests sorted
// by arrival (stable: equal times keep their file order). A row with a missing or
// invalid field is an error naming its line, column and value, as is a file with no
// requests.
func ReadAzureLLM(r io.Reader) ([]AzureLLMRequest, error) {
	t, err := newTable(r, "Azure LLM requests", colAzureAt, colAzureContext, colAzureGenerated)
	if err != nil {
		return nil, err
	}
	var reqs []AzureLLMRequest
	for {
		row, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		at, errAt := row.time(colAzureAt, 7)
		ctx, errCtx := row.int(colAzureContext, 0, maxAzureTokens)
		gen, errGen := row.int(colAzureGenerated, 0, maxAzureTokens)
		if err := cmp.Or(errAt, errCtx, errGen); err != nil {
			return nil, err
		}
		reqs = append(reqs, AzureLLMRequest{At: at, ContextTokens: int(ctx), GeneratedTokens: int(gen)})
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: %w", t.name, errNoRecords)
	}
	slices.SortStableFunc(reqs, func(a, b AzureLLMRequest) int { return a.At.Compare(b.At) })
	return reqs, nil
}
