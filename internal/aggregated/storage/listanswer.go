package storage

import (
	"bytes"
	"io"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// A LIST answer is the typed list (what every reader of the answer sees:
// table conversion, metadata-only lists, audit) plus the cache objects
// its items were copied from. It is a runtime.CacheableObject: the API
// server's encoders hand it their encode function, and when that writes
// compact JSON the answer is written from each object's JSON as the
// cache keeps it (watchcache.Listed.JSON, encoded once per version of
// the object) instead of encoding every item again.

// workspaceList is a LIST answer of coderworkspaces.
type workspaceList struct {
	aggv1.CoderWorkspaceList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*workspaceList)(nil)

func (l *workspaceList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderWorkspaceList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderWorkspace{}}
	return encodeListed(id, encode, w, &l.CoderWorkspaceList, len(l.Items), empty, l.listed)
}

func (s *WorkspaceStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &workspaceList{
		CoderWorkspaceList: aggv1.CoderWorkspaceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderWorkspace](objs)},
		listed:             objs,
	}
}

func (l *workspaceList) GetObject() runtime.Object { return l.CoderWorkspaceList.DeepCopy() }

// templateList is a LIST answer of codertemplates.
type templateList struct {
	aggv1.CoderTemplateList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*templateList)(nil)

func (l *templateList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderTemplateList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderTemplate{}}
	return encodeListed(id, encode, w, &l.CoderTemplateList, len(l.Items), empty, l.listed)
}

func (s *TemplateStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &templateList{
		CoderTemplateList: aggv1.CoderTemplateList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderTemplate](objs)},
		listed:            objs,
	}
}

func (l *templateList) GetObject() runtime.Object { return l.CoderTemplateList.DeepCopy() }

// templateVersionList is a LIST answer of codertemplateversions.
type templateVersionList struct {
	aggv1.CoderTemplateVersionList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*templateVersionList)(nil)

func (l *templateVersionList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderTemplateVersionList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderTemplateVersion{}}
	return encodeListed(id, encode, w, &l.CoderTemplateVersionList, len(l.Items), empty, l.listed)
}

func (l *templateVersionList) GetObject() runtime.Object {
	return l.CoderTemplateVersionList.DeepCopy()
}

func (s *TemplateVersionStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &templateVersionList{
		CoderTemplateVersionList: aggv1.CoderTemplateVersionList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderTemplateVersion](objs)},
		listed:                   objs,
	}
}

// userList is a LIST answer of coderusers.
type userList struct {
	aggv1.CoderUserList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*userList)(nil)

func (l *userList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderUserList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderUser{}}
	return encodeListed(id, encode, w, &l.CoderUserList, len(l.Items), empty, l.listed)
}

func (l *userList) GetObject() runtime.Object { return l.CoderUserList.DeepCopy() }

func (s *UserStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &userList{
		CoderUserList: aggv1.CoderUserList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderUser](objs)},
		listed:        objs,
	}
}

// listItems turns a list's objects (each a *T) into a typed list's
// items: shallow copies, which share the cache's maps and slices, as
// kube-apiserver's own watch cache answers lists; the API server only
// reads a list's items.
func listItems[T any](objs []watchcache.Listed) []T {
	items := make([]T, len(objs))
	for i, o := range objs {
		items[i] = *any(o.Obj).(*T)
	}
	return items
}

// splices remembers, per encoder (runtime.Identifier), whether a list
// spliced from its items' JSON is byte for byte what the encoder writes
// for the whole list. The first list with items an encoder writes is
// encoded both ways and compared; only an encoder whose answers matched
// is served spliced lists afterwards. Encoders are few (one per media
// type and option set), so the map stays small.
var splices sync.Map // runtime.Identifier -> bool

// encodeListed writes list (n items, copied from listed) with encode, or
// spliced from listed's JSON where encode's answers are known to match:
// empty is the list without items, whose encoding gives the envelope.
func encodeListed(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer,
	list runtime.Object, n int, empty runtime.Object, listed []watchcache.Listed) error {
	if n == 0 || n != len(listed) {
		return encode(list, w)
	}
	verdict, known := splices.Load(id)
	if known && !verdict.(bool) {
		return encode(list, w)
	}
	if known {
		ok, err := spliceList(w, encode, empty, listed)
		if err != nil || ok {
			return err
		}
		// The envelope changed shape: not this encoder's after all.
		splices.Store(id, false)
		return encode(list, w)
	}
	var spliced, whole bytes.Buffer
	ok, err := spliceList(&spliced, encode, empty, listed)
	if err != nil {
		return err
	}
	if err := encode(list, &whole); err != nil {
		return err
	}
	splices.Store(id, ok && bytes.Equal(spliced.Bytes(), whole.Bytes()))
	_, err = w.Write(whole.Bytes())
	return err
}

// listEnd is how a compact JSON encoding of a list without items ends.
const listEnd = `"items":[]}` + "\n"

// spliceList writes the list as a compact JSON encoder writes it: the
// envelope of empty's encoding with the items' JSON, comma-separated, in
// its array. It returns false, having written nothing, when empty's
// encoding does not end as compact JSON does.
func spliceList(w io.Writer, encode func(runtime.Object, io.Writer) error, empty runtime.Object, listed []watchcache.Listed) (bool, error) {
	var env bytes.Buffer
	if err := encode(empty, &env); err != nil {
		return false, err
	}
	if !bytes.HasSuffix(env.Bytes(), []byte(listEnd)) {
		return false, nil
	}
	head := env.Bytes()[:env.Len()-len("]}\n")]
	// The opening brace alone first, as the streaming JSON encoder writes
	// it: the API server's response writer recognizes a stream by a
	// first write that short, and then compresses the answer when it
	// grows beyond its threshold, as it does the encoder's (where
	// withListCompression, in internal/aggregated/apiserver, has not taken
	// the compression over).
	if _, err := w.Write(head[:1]); err != nil {
		return true, err
	}
	if _, err := w.Write(head[1:]); err != nil {
		return true, err
	}
	for i, l := range listed {
		data, err := l.JSON()
		if err != nil {
			return true, err
		}
		if i > 0 {
			if _, err := w.Write([]byte{','}); err != nil {
				return true, err
			}
		}
		if _, err := w.Write(data); err != nil {
			return true, err
		}
	}
	_, err := w.Write([]byte("]}\n"))
	return true, err
}

// groupList is a LIST answer of codergroups.
type groupList struct {
	aggv1.CoderGroupList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*groupList)(nil)

func (l *groupList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderGroupList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderGroup{}}
	return encodeListed(id, encode, w, &l.CoderGroupList, len(l.Items), empty, l.listed)
}

func (l *groupList) GetObject() runtime.Object { return l.CoderGroupList.DeepCopy() }

func (s *GroupStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &groupList{
		CoderGroupList: aggv1.CoderGroupList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderGroup](objs)},
		listed:         objs,
	}
}

// organizationList is a LIST answer of coderorganizations.
type organizationList struct {
	aggv1.CoderOrganizationList
	listed []watchcache.Listed
}

var _ runtime.CacheableObject = (*organizationList)(nil)

func (l *organizationList) CacheEncode(id runtime.Identifier, encode func(runtime.Object, io.Writer) error, w io.Writer) error {
	empty := &aggv1.CoderOrganizationList{TypeMeta: l.TypeMeta, ListMeta: l.ListMeta, Items: []aggv1.CoderOrganization{}}
	return encodeListed(id, encode, w, &l.CoderOrganizationList, len(l.Items), empty, l.listed)
}

func (l *organizationList) GetObject() runtime.Object { return l.CoderOrganizationList.DeepCopy() }

func (s *OrganizationStorage) listOf(objs []watchcache.Listed, rv string) runtime.Object {
	return &organizationList{
		CoderOrganizationList: aggv1.CoderOrganizationList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: listItems[aggv1.CoderOrganization](objs)},
		listed:                objs,
	}
}
