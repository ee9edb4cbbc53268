package traces

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// MooncakeRequest is one request of Mooncake's traces (kvcache-ai/Mooncake,
// FAST25-release/traces/*.jsonl): like Azure's, arrivals and tokens with no service
// times, so a replay needs its own model of tokens to seconds.
type MooncakeRequest struct {
	At           time.Duration // arrival, from the trace's start (timestamp, in ms)
	InputTokens  int           // input_length, 0 to 10,000,000
	OutputTokens int           // output_length, 0 to 10,000,000
}

// mooncakeLine is one line of the file as JSON: the fields the reader needs, as
// pointers so a missing one is told apart from 0. Others (the source's hash_ids) are
// ignored.
type mooncakeLine struct {
	Timestamp    *json.Number `json:"timestamp"`
	InputLength  *json.Number `json:"input_length"`
	OutputLength *json.Number `json:"output_length"`
}

// maxMooncakeMS bounds a timestamp: a year of milliseconds, far beyond any trace.
const maxMooncakeMS = 365 * 24 * 3600 * 1000

// ReadMooncake reads a whole Mooncake trace, one JSON object per line
// ({"timestamp": ms, "input_length": n, "output_length": n}; blank lines are skipped),
// and returns its requests sorted by arrival (stable: equal times keep their file order).
// A line that is not such an object, or has a missing or invalid field, is an error
// naming its line, field and value, as is a file with no requests.
func ReadMooncake(r io.Reader) ([]MooncakeRequest, error) {
	const name = "Mooncake requests"
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024) // the source's lines carry hash_ids: long
	var reqs []MooncakeRequest
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l mooncakeLine
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber()
		if err := d.Decode(&l); err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", name, n, err)
		}
		if d.More() {
			return nil, fmt.Errorf("%s: line %d: more than one JSON value", name, n)
		}
		ms, errAt := mooncakeNumber(l.Timestamp, "timestamp", maxMooncakeMS)
		in, errIn := mooncakeNumber(l.InputLength, "input_length", maxAzureTokens)
		out, errOut := mooncakeNumber(l.OutputLength, "output_length", maxAzureTokens)
		if err := errors.Join(errAt, errIn, errOut); err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", name, n, err)
		}
		reqs = append(reqs, MooncakeRequest{At: time.Duration(ms) * time.Millisecond, InputTokens: int(in), OutputTokens: int(out)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: no requests", name)
	}
	slices.SortStableFunc(reqs, func(a, b MooncakeRequest) int { return cmp.Compare(a.At, b.At) })
	return reqs, nil
}

// mooncakeNumber checks one field: present, an integer, 0 to most.
func mooncakeNumber(v *json.Number, field string, most int64) (int64, error) {
	if v == nil {
		return 0, fmt.Errorf("field %s missing", field)
	}
	n, err := v.Int64()
	if err != nil {
		// 1e3 or 12.0 are integers JSON may spell so; a fraction is not.
		f, ferr := v.Float64()
		if ferr != nil || f != math.Trunc(f) || f < math.MinInt64 || f > math.MaxInt64 {
			return 0, fmt.Errorf("field %s %q: want a whole number", field, v.String())
		}
		n = int64(f)
	}
	if n < 0 || n > most {
		return 0, fmt.Errorf("field %s %q: want 0 to %d", field, v.String(), most)
	}
	return n, nil
}
