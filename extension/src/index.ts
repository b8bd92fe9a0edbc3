import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { JobView } from './jobview';
import { JobsModel } from './model';
import { JobsPanel } from './panel';
import { SpotStatus } from './statusbar';

const PLUGIN_ID = 'spotnb:plugin';

const CommandIDs = {
  openJob: 'spotnb:open-job',
  showPanel: 'spotnb:show-panel',
  refresh: 'spotnb:refresh'
} as const;

export const spotIcon = new LabIcon({
  name: 'spotnb:spot',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M6.5 19a4.5 4.5 0 0 1-.6-8.96A6 6 0 0 1 17.6 8.5 4.25 4.25 0 0 1 17.75 19H6.5zm0-2h11.25' +
    'a2.25 2.25 0 0 0 0-4.5h-1.6l-.1-1.4A4 4 0 0 0 8.1 10.7l-.3 1.2-1.2.1A2.5 2.5 0 0 0 6.5 17z"/>' +
    '<path d="M12.6 11 10 15h2l-.6 3 2.6-4h-2z"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Spot jobs side panel, job view and status-bar item for spotnb.',
  autoStart: true,
  requires: [ILabShell],
  optional: [IStatusBar, ICommandPalette, ILayoutRestorer, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    rendermime: IRenderMimeRegistry | null
  ) => {
    const model = new JobsModel(2000);
    const tracker = new WidgetTracker<MainAreaWidget<JobView>>({ namespace: 'spotnb-job' });

    const panel = new JobsPanel(model, id => void app.commands.execute(CommandIDs.openJob, { id }));
    panel.title.icon = spotIcon;
    shell.add(panel, 'left', { rank: 650 });

    app.commands.addCommand(CommandIDs.openJob, {
      label: args => (args.id ? `Open spot job ${args.id}` : 'Open spot job'),
      execute: args => {
        const id = String(args.id ?? '');
        if (!id) {
          return;
        }
        const open = tracker.find(w => w.content.jobId === id);
        if (open) {
          shell.activateById(open.id);
          return open;
        }
        const content = new JobView(id, rendermime);
        const widget = new MainAreaWidget({ content });
        widget.id = `spotnb-job-${id}`;
        widget.title.label = id;
        widget.title.icon = spotIcon;
        widget.title.closable = true;
        void tracker.add(widget);
        shell.add(widget, 'main');
        shell.activateById(widget.id);
        return widget;
      }
    });
    app.commands.addCommand(CommandIDs.showPanel, {
      label: 'Show Spot jobs',
      caption: 'Open the Spot jobs side panel',
      icon: spotIcon,
      execute: () => shell.activateById(panel.id)
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Spot jobs',
      execute: () => model.refresh()
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.showPanel, category: 'Spot jobs' });
      palette.addItem({ command: CommandIDs.refresh, category: 'Spot jobs' });
    }
    if (restorer) {
      restorer.add(panel, 'spotnb-jobs-panel');
      void restorer.restore(tracker, {
        command: CommandIDs.openJob,
        args: w => ({ id: w.content.jobId }),
        name: w => w.content.jobId
      });
    }
    if (statusBar) {
      const item = new SpotStatus(model, () => shell.activateById(panel.id));
      statusBar.registerStatusItem('spotnb:status', {
        item,
        align: 'left',
        rank: 50,
        isActive: () => true
      });
    }
    model.start();
  }
};

export default plugin;
