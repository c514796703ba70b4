package mcpserver

// allTools lists every tool the server offers, in the order tools/list
// shows them; the configuration decides which are registered.
func (s *Server) allTools() []tool {
	var all []tool
	all = append(all, s.controlPlaneTools()...)
	all = append(all, s.templateTools()...)
	all = append(all, s.templateVersionTools()...)
	all = append(all, s.workspaceTools()...)
	all = append(all, s.workspaceLifecycleTools()...)
	all = append(all, s.diagnoseTools()...)
	all = append(all, s.userTools()...)
	all = append(all, s.eventTools()...)
	all = append(all, s.logTools()...)
	all = append(all, s.buildLogTools()...)
	all = append(all, s.healthTools()...)
	return all
}
