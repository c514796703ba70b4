package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/coder/coder-k8s/internal/jsonskim"
)

// decodeSparse decodes the JSON object data into v, a pointer to a struct,
// as json.Unmarshal would for the fields v declares, but passes over every
// other value without decoding it: a list tool reads seven fields of each
// object in a list of hundreds of KiB, and json.Unmarshal (a validating
// pass, then a decoding pass that steps through skipped values a byte at a
// time) took most of such a call. Leaf values (strings, numbers, bools,
// types with their own UnmarshalJSON) are handed to json.Unmarshal, so
// they decode exactly as it decodes them. Input json.Unmarshal accepts
// gives the same result; malformed input gives an error, never a panic,
// though malformed parts inside skipped values may go unnoticed.
func decodeSparse(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("decodeSparse: want a non-nil pointer")
	}
	d := &sparseDecoder{s: jsonskim.NewBytes(data)}
	if err := d.into(rv.Elem(), planFor(rv.Elem().Type())); err != nil {
		return err
	}
	if !d.s.End() {
		return d.s.Errorf("unexpected data after the top-level value")
	}
	return nil
}

// sparseDecoder walks the JSON with a jsonskim.Scanner, which passes over
// the values no field asks for.
type sparseDecoder struct {
	s *jsonskim.Scanner
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// into decodes the next value into v, of the type p plans.
func (d *sparseDecoder) into(v reflect.Value, p *typePlan) error {
	switch p.kind {
	case planStruct:
		if d.s.Literal("null") {
			return nil
		}
		return d.object(v, p)
	case planSlice:
		if d.s.Literal("null") {
			v.SetZero()
			return nil
		}
		return d.array(v, p.elem)
	case planPointer:
		if d.s.Literal("null") {
			v.SetZero()
			return nil
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return d.into(v.Elem(), p.elem)
	default:
		return d.leaf(v)
	}
}

// leaf decodes the next value into v with json.Unmarshal.
func (d *sparseDecoder) leaf(v reflect.Value) error {
	raw, err := d.s.Value()
	if err != nil {
		return err
	}
	// The common cases, decoded as json.Unmarshal decodes them.
	switch {
	case v.Kind() == reflect.String && len(raw) >= 2 && raw[0] == '"' && plainASCII(raw[1:len(raw)-1]):
		v.SetString(string(raw[1 : len(raw)-1]))
		return nil
	case v.Kind() == reflect.Bool && (string(raw) == "true" || string(raw) == "false"):
		v.SetBool(raw[0] == 't')
		return nil
	}
	if err := json.Unmarshal(raw, v.Addr().Interface()); err != nil {
		return fmt.Errorf("JSON at offset %d: %w", d.s.Offset()-int64(len(raw)), err)
	}
	return nil
}

// plainASCII reports whether s needs no unescaping and no UTF-8 checks.
func plainASCII(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c >= 0x80 || c == '\\' || c == '"' {
			return false
		}
	}
	return true
}

// object decodes an object into the struct v: the fields v declares
// (by JSON name), skipping the rest.
func (d *sparseDecoder) object(v reflect.Value, p *typePlan) error {
	if !d.s.Consume('{') {
		return d.s.Errorf("want '{'")
	}
	if d.s.Consume('}') {
		return nil
	}
	for {
		raw, err := d.s.Value()
		if err != nil {
			return err
		}
		if raw[0] != '"' {
			return d.s.Errorf("want an object key")
		}
		key := raw[1 : len(raw)-1]
		if !plainASCII(key) {
			var k string
			if err := json.Unmarshal(raw, &k); err != nil {
				return d.s.Errorf("object key: %v", err)
			}
			key = []byte(k)
		}
		if !d.s.Consume(':') {
			return d.s.Errorf("want ':'")
		}
		if f, ok := p.find(key); ok {
			if err := d.into(fieldByIndex(v, f.index), f.plan); err != nil {
				return err
			}
		} else if _, err := d.s.Value(); err != nil {
			return err
		}
		if done, err := d.next('}'); done || err != nil {
			return err
		}
	}
}

// next consumes what follows a member or element: a ',' (more follow) or
// end (done).
func (d *sparseDecoder) next(end byte) (done bool, err error) {
	if d.s.Consume(',') {
		return false, nil
	}
	if d.s.Consume(end) {
		return true, nil
	}
	return false, d.s.Errorf("want ',' or %q", end)
}

// array decodes an array into the slice v, into its elements in place as
// encoding/json does.
func (d *sparseDecoder) array(v reflect.Value, elem *typePlan) error {
	if !d.s.Consume('[') {
		return d.s.Errorf("want '['")
	}
	i := 0
	if !d.s.Consume(']') {
		for {
			if i >= v.Cap() {
				v.Grow(1)
			}
			if i >= v.Len() {
				v.SetLen(i + 1)
			}
			if err := d.into(v.Index(i), elem); err != nil {
				return err
			}
			i++
			done, err := d.next(']')
			if err != nil {
				return err
			}
			if done {
				break
			}
		}
	}
	if i < v.Len() {
		v.SetLen(i)
	}
	if i == 0 {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0))
	}
	return nil
}

// typePlan is how decodeSparse decodes a type, worked out once per type.
type typePlan struct {
	kind planKind
	// elem plans a slice's elements or what a pointer points to.
	elem *typePlan
	// fields are a struct's, by JSON name as encoding/json names them:
	// the tag's name, else the field name; untagged embedded structs lend
	// their fields.
	fields map[string]planField
	names  []string
}

type planKind int

const (
	planLeaf    planKind = iota // json.Unmarshal decodes it
	planStruct                  // fields picked by name, the rest skipped
	planSlice                   // of structs
	planPointer                 // to a struct
)

type planField struct {
	index []int
	plan  *typePlan
}

// find looks key up as encoding/json does: the exact name first, then one
// that differs only in case.
func (p *typePlan) find(key []byte) (planField, bool) {
	if f, ok := p.fields[string(key)]; ok {
		return f, true
	}
	for _, n := range p.names {
		if bytes.EqualFold(key, []byte(n)) {
			return p.fields[n], true
		}
	}
	return planField{}, false
}

var plans sync.Map // reflect.Type -> *typePlan

func planFor(t reflect.Type) *typePlan {
	if p, ok := plans.Load(t); ok {
		return p.(*typePlan)
	}
	p := &typePlan{}
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType):
	case t.Kind() == reflect.Struct:
		p.kind, p.fields = planStruct, map[string]planField{}
		// Stored before its fields are planned, so that a type that refers
		// to itself finds it.
		plans.Store(t, p)
		p.addFields(t, nil)
	case t.Kind() == reflect.Slice && planFor(t.Elem()).kind == planStruct:
		p.kind, p.elem = planSlice, planFor(t.Elem())
	case t.Kind() == reflect.Pointer && planFor(t.Elem()).kind == planStruct:
		p.kind, p.elem = planPointer, planFor(t.Elem())
	}
	plans.Store(t, p)
	return p
}

func (p *typePlan) addFields(t reflect.Type, index []int) {
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		idx := append(append([]int(nil), index...), i)
		if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
			p.addFields(sf.Type, idx)
			continue
		}
		// Like encoding/json: an embedded struct of an unexported type is
		// kept (its exported fields can be set).
		if !sf.IsExported() && !(sf.Anonymous && sf.Type.Kind() == reflect.Struct) {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if _, dup := p.fields[name]; !dup {
			p.fields[name] = planField{index: idx, plan: planFor(sf.Type)}
			p.names = append(p.names, name)
		}
	}
}

func fieldByIndex(v reflect.Value, index []int) reflect.Value {
	for _, i := range index {
		v = v.Field(i)
	}
	return v
}
