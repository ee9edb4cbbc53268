// Package traces reads the public production traces in shared/testdata/traces (GenTD26,
// Azure's LLM inference trace, Alibaba's openb GPU cluster trace) in their sources' own
// formats, so the same readers work on the other parts of those datasets. Columns are
// found by their header names, not their places. These files are outside input: a reader
// never panics on them, and an error names the file's line, the column and the value.
package traces

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// errNoRecords is wrapped, with the format's name, by a reader given a header and no rows:
// a replay of nothing is a mistake, not an empty result.
var errNoRecords = errors.New("no records after the header")

// table reads a CSV file with a header row, locating columns by name.
type table struct {
	name string // the format, for errors: "GenTD26 requests"
	r    *csv.Reader
	col  map[string]int
}

// newTable reads the header of r and checks that it has every required column.
func newTable(r io.Reader, name string, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // checked per row, with a clearer error
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: empty file, want a header row with %s", name, strings.Join(required, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t := &table{name: name, r: cr, col: make(map[string]int, len(header))}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")) // a BOM some tools write
		if _, dup := t.col[h]; !dup {
			t.col[h] = i
		}
	}
	var missing []string
	for _, c := range required {
		if _, ok := t.col[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: header %q lacks column(s) %s", name, strings.Join(header, ","), strings.Join(missing, ", "))
	}
	return t, nil
}

// row is one record of a table.
type row struct {
	t    *table
	line int
	rec  []string
}

// next returns the next row, or io.EOF after the last. A row with fewer fields than a
// column it is asked for reads that column as empty.
func (t *table) next() (row, error) {
	rec, err := t.r.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return row{}, io.EOF
		}
		return row{}, fmt.Errorf("%s: %w", t.name, err)
	}
	line, _ := t.r.FieldPos(0)
	return row{t: t, line: line, rec: rec}, nil
}

// str returns the named column's value, trimmed; empty when the row is short.
func (r row) str(col string) string {
	i := r.t.col[col]
	if i >= len(r.rec) {
		return ""
	}
	return strings.TrimSpace(r.rec[i])
}

// errorf returns an error naming the table, the row's line and the column.
func (r row) errorf(col, format string, args ...any) error {
	return fmt.Errorf("%s: line %d, column %s: %s", r.t.name, r.line, col, fmt.Sprintf(format, args...))
}

// float parses the named column as a finite number within [lo, hi].
func (r row) float(col string, lo, hi float64) (float64, error) {
	v := r.str(col)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < lo || f > hi {
		return 0, r.errorf(col, "%q: want a number from %g to %g", v, lo, hi)
	}
	return f, nil
}

// int parses the named column as a whole number within [lo, hi].
func (r row) int(col string, lo, hi int64) (int64, error) {
	v := r.str(col)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, r.errorf(col, "%q: want a whole number from %d to %d", v, lo, hi)
	}
	return n, nil
}

// text returns the named column's value, which must not be empty.
func (r row) text(col string) (string, error) {
	v := r.str(col)
	if v == "" {
		return "", r.errorf(col, "%q: want a value", v)
	}
	return v, nil
}

// timeLayout is how GenTD26 and Azure write times: no zone, read as UTC.
const timeLayout = "2006-01-02 15:04:05"

// time parses the named column as a UTC time written exactly as timeLayout, optionally
// followed by '.' and 1 to frac fractional-second digits.
func (r row) time(col string, frac int) (time.Time, error) {
	v := r.str(col)
	if t, err := time.Parse(timeLayout, v); err == nil && timeShaped(v, frac) { // Parse checks ranges: month 13, February 30
		return t, nil
	}
	want := fmt.Sprintf("%q", timeLayout)
	if frac > 0 {
		want += fmt.Sprintf(" with up to %d fractional digits", frac)
	}
	return time.Time{}, r.errorf(col, "%q: want a time %s, no zone", v, want)
}

// timeShaped reports whether v has timeLayout's shape digit for digit, then at most frac
// fractional digits after a '.'. time.Parse alone also takes one-digit hours and any
// number of fractional digits.
func timeShaped(v string, frac int) bool {
	if len(v) < len(timeLayout) {
		return false
	}
	for i := range len(timeLayout) {
		c := timeLayout[i]
		if isDigit(c) != isDigit(v[i]) || !isDigit(c) && v[i] != c {
			return false
		}
	}
	f := v[len(timeLayout):]
	return f == "" || len(f) >= 2 && len(f) <= frac+1 && f[0] == '.' && strings.TrimLeft(f[1:], "0123456789") == ""
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// readRows reads every row of t with parse, which returns the record and whether to keep
// it. It stops at the first error, and fails when it kept no row: a trace of nothing is a
// mistake, never something to replay.
func readRows[T any](t *table, parse func(row) (T, bool, error)) ([]T, error) {
	var out []T
	for {
		r, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		v, keep, err := parse(r)
		if err != nil {
			return nil, err
		}
		if keep {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w", t.name, errNoRecords)
	}
	return out, nil
}
