package storage

import (
	"context"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// checkTable verifies the table's shape: one cell per column (also when
// the headers are left out), cell types as the columns declare, and each
// row's object.
func checkTable(t *testing.T, table *metav1.Table, columns []metav1.TableColumnDefinition, noHeaders bool, objs []runtime.Object) {
	t.Helper()
	if noHeaders {
		if table.ColumnDefinitions != nil {
			t.Errorf("NoHeaders: got %d column definitions", len(table.ColumnDefinitions))
		}
	} else if len(table.ColumnDefinitions) != len(columns) {
		t.Fatalf("got %d column definitions, want %d", len(table.ColumnDefinitions), len(columns))
	}
	if len(table.Rows) != len(objs) {
		t.Fatalf("got %d rows, want %d", len(table.Rows), len(objs))
	}
	for i, row := range table.Rows {
		if len(row.Cells) != len(columns) {
			t.Fatalf("row %d has %d cells for %d columns", i, len(row.Cells), len(columns))
		}
		for j, c := range columns {
			var ok bool
			switch c.Type {
			case "string":
				_, ok = row.Cells[j].(string)
			case "boolean":
				_, ok = row.Cells[j].(bool)
			case "integer":
				_, ok = row.Cells[j].(int64)
			default:
				t.Fatalf("column %q has unexpected type %q", c.Name, c.Type)
			}
			if !ok {
				t.Errorf("row %d column %q (%s) holds %T", i, c.Name, c.Type, row.Cells[j])
			}
		}
		if row.Object.Object == nil {
			t.Errorf("row %d has no object", i)
			continue
		}
		got, want := row.Object.Object.(metav1.Object), objs[i].(metav1.Object)
		if got.GetName() != want.GetName() {
			t.Errorf("row %d object is %q, want %q", i, got.GetName(), want.GetName())
		}
	}
}

func TestColumnPriorities(t *testing.T) {
	for _, tc := range []struct {
		name    string
		columns []metav1.TableColumnDefinition
		wide    map[string]bool
	}{
		{"workspaces", workspaceColumns, map[string]bool{"Organization": true, "Version": true, "Outdated": true, "Healthy": true, "Shutdown": true}},
		{"templates", templateColumns, map[string]bool{"Display Name": true, "Deprecated": true, "Users": true, "Files": true}},
	} {
		if tc.columns[0].Name != "Name" || tc.columns[0].Format != "name" || tc.columns[0].Priority != 0 {
			t.Errorf("%s: first column %+v, want the name", tc.name, tc.columns[0])
		}
		seen := map[string]bool{}
		for _, c := range tc.columns {
			if seen[c.Name] {
				t.Errorf("%s: column %q twice", tc.name, c.Name)
			}
			seen[c.Name] = true
			want := int32(0)
			if tc.wide[c.Name] {
				want = 1
			}
			if c.Priority != want {
				t.Errorf("%s: column %q priority %d, want %d", tc.name, c.Name, c.Priority, want)
			}
			if c.Description == "" {
				t.Errorf("%s: column %q has no description", tc.name, c.Name)
			}
		}
		for name := range tc.wide {
			if !seen[name] {
				t.Errorf("%s: no -o wide column %q", tc.name, name)
			}
		}
	}
}

func TestWorkspaceTable(t *testing.T) {
	ws, _ := fxStorages(t)
	ctx := context.Background()

	w := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	w.ResourceVersion = "1700000000000123456"
	w.Status.AutoShutdownDeadline = fxPtr(metav1.NewTime(time.Now().Add(2 * time.Hour)))

	sw := fxWorkspace()
	sw.Name = "old"
	sw.LatestBuild = codersdk.WorkspaceBuild{}
	noBuild := toWorkspace(fxTarget(t, "prod", false), sw, nil)
	noBuild.CreationTimestamp = metav1.Time{}

	t.Run("single object", func(t *testing.T) {
		for _, noHeaders := range []bool{false, true} {
			table, err := ws.ConvertToTable(ctx, w, &metav1.TableOptions{NoHeaders: noHeaders})
			if err != nil {
				t.Fatal(err)
			}
			checkTable(t, table, workspaceColumns, noHeaders, []runtime.Object{w})
			if table.ResourceVersion != w.ResourceVersion {
				t.Errorf("resourceVersion = %q, want %q", table.ResourceVersion, w.ResourceVersion)
			}
			cells := table.Rows[0].Cells
			want := map[int]any{0: "acme.alice.dev", 1: "alice", 2: "docker", 3: "running", 4: "True", 5: "0", 6: true, 9: "acme", 10: "v1", 11: true, 12: true}
			for i, v := range want {
				if cells[i] != v {
					t.Errorf("column %q = %v, want %v", workspaceColumns[i].Name, cells[i], v)
				}
			}
			for _, i := range []int{7, 8, 13} {
				if s := cells[i].(string); s == "" || s == "<none>" || s == "<unknown>" || s == "<invalid>" {
					t.Errorf("column %q = %q, want a duration", workspaceColumns[i].Name, s)
				}
			}
		}
	})

	t.Run("no options", func(t *testing.T) {
		table, err := ws.ConvertToTable(ctx, w, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkTable(t, table, workspaceColumns, false, []runtime.Object{w})
	})

	t.Run("placeholders", func(t *testing.T) {
		table, err := ws.ConvertToTable(ctx, noBuild, &metav1.TableOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cells := table.Rows[0].Cells
		for i, v := range map[int]any{7: "<none>", 8: "<unknown>", 10: "<none>", 13: "<none>"} {
			if cells[i] != v {
				t.Errorf("column %q = %v, want %v", workspaceColumns[i].Name, cells[i], v)
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		list := &aggv1.CoderWorkspaceList{
			ListMeta: metav1.ListMeta{ResourceVersion: "1700000000000999999", Continue: "next"},
			Items:    []aggv1.CoderWorkspace{*w, *noBuild},
		}
		for _, noHeaders := range []bool{false, true} {
			table, err := ws.ConvertToTable(ctx, list, &metav1.TableOptions{NoHeaders: noHeaders})
			if err != nil {
				t.Fatal(err)
			}
			checkTable(t, table, workspaceColumns, noHeaders, []runtime.Object{w, noBuild})
			if table.ResourceVersion != "1700000000000999999" || table.Continue != "next" {
				t.Errorf("list meta = %q, %q", table.ResourceVersion, table.Continue)
			}
		}
	})

	t.Run("empty list", func(t *testing.T) {
		table, err := ws.ConvertToTable(ctx, &aggv1.CoderWorkspaceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkTable(t, table, workspaceColumns, false, nil)
		if table.ResourceVersion != "7" {
			t.Errorf("resourceVersion = %q", table.ResourceVersion)
		}
	})

	t.Run("wrong kind", func(t *testing.T) {
		if _, err := ws.ConvertToTable(ctx, &aggv1.CoderTemplate{}, nil); err == nil {
			t.Error("a template converted as a workspace")
		}
		if _, err := ws.ConvertToTable(ctx, &aggv1.CoderTemplateList{Items: []aggv1.CoderTemplate{{}}}, nil); err == nil {
			t.Error("a template list converted as workspaces")
		}
	})
}

func TestTemplateTable(t *testing.T) {
	_, ts := fxStorages(t)
	ctx := context.Background()

	tpl := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), fxFiles)
	tpl.ResourceVersion = "1700000000000654321"
	bare := toTemplate(fxTarget(t, "prod", false), fxTemplate(), nil, nil)
	bare.Name = "acme.bare"

	t.Run("single object", func(t *testing.T) {
		for _, noHeaders := range []bool{false, true} {
			table, err := ts.ConvertToTable(ctx, tpl, &metav1.TableOptions{NoHeaders: noHeaders})
			if err != nil {
				t.Fatal(err)
			}
			checkTable(t, table, templateColumns, noHeaders, []runtime.Object{tpl})
			if table.ResourceVersion != tpl.ResourceVersion {
				t.Errorf("resourceVersion = %q, want %q", table.ResourceVersion, tpl.ResourceVersion)
			}
			cells := table.Rows[0].Cells
			want := map[int]any{0: "acme.docker", 1: "acme", 2: "v3", 3: "succeeded", 5: "Docker", 6: true, 7: int64(7), 8: int64(2)}
			for i, v := range want {
				if cells[i] != v {
					t.Errorf("column %q = %v (%T), want %v (%T)", templateColumns[i].Name, cells[i], cells[i], v, v)
				}
			}
			if s := cells[4].(string); s == "" || s == "<unknown>" || s == "<invalid>" {
				t.Errorf("age = %q", s)
			}
		}
	})

	t.Run("placeholders", func(t *testing.T) {
		table, err := ts.ConvertToTable(ctx, bare, nil)
		if err != nil {
			t.Fatal(err)
		}
		cells := table.Rows[0].Cells
		for i, v := range map[int]any{2: "<none>", 3: "<none>", 8: int64(0)} {
			if cells[i] != v {
				t.Errorf("column %q = %v, want %v", templateColumns[i].Name, cells[i], v)
			}
		}
	})

	t.Run("list", func(t *testing.T) {
		list := &aggv1.CoderTemplateList{
			ListMeta: metav1.ListMeta{ResourceVersion: "99"},
			Items:    []aggv1.CoderTemplate{*tpl, *bare},
		}
		for _, noHeaders := range []bool{false, true} {
			table, err := ts.ConvertToTable(ctx, list, &metav1.TableOptions{NoHeaders: noHeaders})
			if err != nil {
				t.Fatal(err)
			}
			checkTable(t, table, templateColumns, noHeaders, []runtime.Object{tpl, bare})
			if table.ResourceVersion != "99" {
				t.Errorf("resourceVersion = %q", table.ResourceVersion)
			}
		}
	})

	t.Run("wrong kind", func(t *testing.T) {
		if _, err := ts.ConvertToTable(ctx, &aggv1.CoderWorkspace{}, nil); err == nil {
			t.Error("a workspace converted as a template")
		}
	})
}

func TestAgeAndOrNone(t *testing.T) {
	if got := age(metav1.Time{}); got != "<unknown>" {
		t.Errorf("age(zero) = %q", got)
	}
	if got := age(metav1.NewTime(time.Now().Add(-3 * time.Hour))); got != "3h" {
		t.Errorf("age(3h ago) = %q", got)
	}
	if orNone("") != "<none>" || orNone("x") != "x" {
		t.Error("orNone")
	}
}
