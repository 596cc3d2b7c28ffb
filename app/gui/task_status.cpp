#include "task_status.h"

#include <QAction>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QStatusBar>

namespace kvscope {

TaskStatus::TaskStatus(QStatusBar* bar, QObject* parent)
    : QObject(parent), m_phase(new QLabel), m_progress(new QProgressBar), m_cancel(new QPushButton(tr("Cancel")))
{
    m_phase->setObjectName(QStringLiteral("phaseLabel"));
    bar->addWidget(m_phase, 1);
    m_progress->setObjectName(QStringLiteral("loadProgress"));
    m_progress->setMaximumWidth(220);
    m_progress->setTextVisible(true);
    bar->addPermanentWidget(m_progress);
    m_cancel->setObjectName(QStringLiteral("cancelButton"));
    m_cancel->setToolTip(tr("Stop loading (Esc)"));
    connect(m_cancel, &QPushButton::clicked, this, &TaskStatus::cancelRequested);
    bar->addPermanentWidget(m_cancel);
}

void TaskStatus::setCancelAction(QAction* action) { m_cancelAction = action; }

void TaskStatus::setText(const QString& text) { m_phase->setText(text); }

void TaskStatus::setPhase(const QString& text, int maximum, const QString& format)
{
    m_phase->setText(text);
    m_progress->setRange(0, maximum);
    setProgress(0);
    m_progress->setFormat(format);
}

void TaskStatus::setProgress(int value)
{
    m_progress->setUpdatesEnabled(false);
    m_progress->setValue(value);
    m_progress->setUpdatesEnabled(true);  // schedules the paint
}

void TaskStatus::setBusy(bool busy)
{
    m_progress->setVisible(busy);
    m_cancel->setVisible(busy);
    if (m_cancelAction) m_cancelAction->setEnabled(busy);
}

}  // namespace kvscope
